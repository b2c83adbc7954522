"""What every page says to the browser about itself: a Content-Security-Policy that runs no
inline script (and pages that need none), HSTS and HTTPS-only cookies under RINGMASTER_HTTPS, and
a refused request logged in one line."""
import re
import runpy
from html.parser import HTMLParser

import pytest
import requests
from django.conf import settings
from django.utils import timezone

from jobs.models import Job, MetricPoint, Script, State
from tests.conftest import ROOT, SERVICES_OF_THE_SESSION, wait_for


def policy(response):
    """The CSP header's directives: {name: [source, ...]}."""
    header = response.headers.get("Content-Security-Policy")
    assert header, f"{response.wsgi_request.path} has no Content-Security-Policy"
    return {name: sources for name, *sources in (part.split() for part in header.split(";") if part.strip())}


class InlineCode(HTMLParser):
    """What a page would run without a file of its own: <script> with code in it, on*= handlers,
    javascript: links."""

    def __init__(self):
        super().__init__()
        self.found, self.in_code = [], False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name, value in attrs.items():
            if name.startswith("on") or (value or "").strip().lower().startswith("javascript:"):
                self.found.append(f"<{tag} {name}={value!r}>")
        self.in_code = tag == "script" and "src" not in attrs and attrs.get("type") != "application/json"

    def handle_endtag(self, tag):
        self.in_code = False

    def handle_data(self, data):
        if self.in_code and data.strip():
            self.found.append(f"<script>{data.strip()[:80]}")


def inline_code(html):
    parser = InlineCode()
    parser.feed(html)
    return parser.found


@pytest.fixture
def pages(image, make_user):
    """The portal's pages, each as (who, path): the user's own, a staff member's, anyone's."""
    alice, root = make_user("alice"), make_user("root", is_staff=True, is_superuser=True)
    script = Script.objects.create(owner=alice, name="t.py", sha256="0" * 64, size=1, content="x")
    now = timezone.now()
    jobs = [Job.objects.create(owner=alice, image=image, gpus=1, max_gpus=4, script=script,
                               time_limit_minutes=5, state=State.SUCCEEDED, started_at=now, finished_at=now)
            for _ in range(2)]
    MetricPoint.objects.bulk_create(MetricPoint(job=job, rank=0, step=1, name="loss", value=1.0, ts=now)
                                    for job in jobs)
    first = jobs[0].pk
    return [(None, "/login/"), (None, "/admin/login/"), (None, "/api/docs/"),
            (alice, "/"), (alice, "/jobs/new/"), (alice, f"/jobs/{first}/"),
            (alice, f"/compare/?jobs={first},{jobs[1].pk}"), (alice, "/usage/"), (alice, "/settings/"),
            (root, "/capacity/"), (root, "/admin/"), (root, "/admin/jobs/job/"), (root, f"/admin/jobs/job/{first}/change/"),
            (root, "/admin/jobs/image/add/")]


def test_every_page_carries_a_csp_without_inline_script_and_needs_none(client, pages):
    for user, path in pages:
        client.logout()
        if user:
            client.force_login(user)
        response = client.get(path)
        assert response.status_code == 200, path
        directives = policy(response)
        assert directives["script-src"] == ["'self'"], path
        assert directives["object-src"] == ["'none'"] and directives["frame-ancestors"] == ["'none'"], path
        # Styles too are the portal's files, but for Swagger UI's own <style> on the API docs.
        assert directives["style-src"] == (["'self'", "'unsafe-inline'"] if path == "/api/docs/" else ["'self'"]), path
        assert inline_code(response.content.decode()) == [], path


def test_the_api_docs_script_is_a_file_the_csp_lets_run(client):
    page = client.get("/api/docs/").content.decode()
    script = next(src for src in re.findall(r'<script src="([^"]+)"', page) if "?script" in src)
    response = client.get(script)
    assert response.status_code == 200 and b"SwaggerUIBundle" in response.content


def settings_under(monkeypatch, **env):
    """portal/settings.py's values as a process started with `env` reads them."""
    monkeypatch.delenv("RINGMASTER_HTTPS", raising=False)
    monkeypatch.setenv("RINGMASTER_DATA_DIR", str(settings.DATA_DIR))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    values = runpy.run_path(str(ROOT / "portal" / "settings.py"))
    return {name: values[name] for name in ("SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_HSTS_SECONDS",
                                            "SECURE_PROXY_SSL_HEADER")}


def test_one_setting_says_the_portal_is_behind_https(monkeypatch):
    behind_https = settings_under(monkeypatch, RINGMASTER_HTTPS="true")
    assert behind_https.pop("SECURE_HSTS_SECONDS") >= 180 * 24 * 3600
    assert behind_https == {"SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True,
                            "SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https")}
    assert settings_under(monkeypatch) == {"SESSION_COOKIE_SECURE": False, "CSRF_COOKIE_SECURE": False,
                                           "SECURE_HSTS_SECONDS": 0, "SECURE_PROXY_SSL_HEADER": None}


def test_https_answers_carry_hsts_and_https_only_cookies_under_the_setting(client, alice, settings):
    # What RINGMASTER_HTTPS=true sets (the test above), with a shorter HSTS.
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = True
    settings.SECURE_HSTS_SECONDS = 3600
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    login = client.get("/login/", HTTP_X_FORWARDED_PROTO="https")
    assert login.headers["Strict-Transport-Security"] == "max-age=3600"
    assert login.cookies["csrftoken"]["secure"]
    answer = client.post("/login/", {"username": "alice", "password": "pw-alice",
                                     "csrfmiddlewaretoken": login.cookies["csrftoken"].value},
                         HTTP_X_FORWARDED_PROTO="https", HTTP_ORIGIN="https://testserver")
    assert answer.status_code == 302 and answer.cookies["sessionid"]["secure"]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_refused_request_is_logged_in_one_line(live_portal, make_user):
    """A 403 is the client's doing, not the portal's fault: one line in the server's log, no traceback."""
    from django.test import Client

    client = Client()
    client.force_login(make_user("bob"))
    server = SERVICES_OF_THE_SESSION["live_portal"]
    before = len(server.output())
    answer = requests.get(f"{live_portal}/capacity/", cookies={"sessionid": client.cookies["sessionid"].value},
                          timeout=30)
    assert answer.status_code == 403
    refusal = "Forbidden (Permission denied): /capacity/"
    wait_for(lambda: refusal in server.output()[before:], timeout=10, message="the 403 in the web server's log")
    logged = server.output()[before:].splitlines()
    assert [line for line in logged if refusal in line] == [next(line for line in logged if refusal in line)]
    assert not [line for line in logged if line.startswith(("Traceback", " ", "django.core.exceptions"))], logged
