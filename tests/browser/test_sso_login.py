"""Single sign-on in headless Chromium (issue 59): a portal served by uvicorn with
RINGMASTER_OIDC_* pointing at a real OpenID Connect provider on loopback (tests/oidc_provider.py);
the login page's button takes the browser to the provider and back, in three redirects, onto the
home page signed in as the provider's user, in the directory's group. The login page's
Content-Security-Policy lets the button's form go on to the provider."""
import pytest
from django.contrib.auth import get_user_model

from tests.conftest import WebServer
from tests.oidc_provider import Provider

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def sso_portal(service_env, tmp_path):
    with Provider() as provider:
        env = {**service_env, "RINGMASTER_OIDC_ISSUER": provider.issuer, "RINGMASTER_OIDC_CLIENT_ID": provider.client_id,
               "RINGMASTER_OIDC_CLIENT_SECRET": provider.client_secret, "RINGMASTER_OIDC_NAME": "Lab SSO"}
        server = WebServer(env, tmp_path / "web.log").start()
        try:
            yield provider, server.url
        finally:
            server.stop()


def test_chromium_signs_in_through_the_provider_in_three_redirects(browser, sso_portal):
    provider, portal = sso_portal
    provider.user = {"sub": "sub-ivy", "preferred_username": "ivy", "email": "ivy@lab.example",
                     "email_verified": True, "groups": ["vision"]}
    context = browser.new_context(base_url=portal)
    refused, redirects = [], []
    context.on("console", lambda message: refused.append(message.text)
               if message.type == "error" and "Content Security Policy" in message.text else None)
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.on("response", lambda response: redirects.append(response.url) if 300 <= response.status < 400 else None)
    page.goto("/login/")
    page.get_by_role("button", name="Sign in with Lab SSO").click()
    page.wait_for_url(f"{portal}/")
    assert page.locator("header.top nav").get_by_text("Log out ivy").is_visible()
    assert refused == []
    assert [url.split("?")[0] for url in redirects] == [
        f"{portal}/accounts/oidc/sso/login/", f"{provider.issuer}/authorize", f"{portal}/accounts/oidc/sso/login/callback/"]
    ivy = get_user_model().objects.get(username="ivy")
    assert list(ivy.groups.values_list("name", flat=True)) == ["vision"]
