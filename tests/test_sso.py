"""Single sign-on (issue 59): /login/ offers the provider of RINGMASTER_OIDC_*, whose button leads
to the provider's authorization endpoint (client id, PKCE, a redirect back to the portal); the
callback signs the right user in, matched on the provider's subject; the groups claim sets the
groups the directory manages at every sign-on, leaving hand-made groups alone, and a claim value
naming the staff group makes the user staff while it lasts. A new subject whose e-mail a local
account has does not take that account over. The provider is a real OpenID Connect provider on
loopback (tests/oidc_provider.py): the portal fetches its discovery document, exchanges the code
at its token endpoint (which checks the PKCE verifier) and reads its userinfo over HTTP."""
import json
import os
import re
import subprocess
import sys
from html import unescape
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from portal.settings import oidc_providers
from tests.conftest import ROOT
from tests.oidc_provider import Provider

pytestmark = pytest.mark.django_db

STAFF = "ringmaster-admins"


@pytest.fixture(scope="module")
def provider():
    with Provider() as running:
        yield running


@pytest.fixture(autouse=True)
def sso_settings(settings, provider):
    settings.SOCIALACCOUNT_PROVIDERS = oidc_providers(provider.issuer, provider.client_id,
                                                      provider.client_secret, "Lab SSO")
    settings.RINGMASTER_OIDC_STAFF_GROUP = STAFF


def directives(policy):
    """A Content-Security-Policy header's directives, {name: [sources]} (in any order)."""
    return {name: sources for name, *sources in (part.split() for part in policy.split(";") if part.strip())}


def sign_on(provider, claims):
    """A browser's way through: the login page's button, the provider, the callback. Returns the
    client (signed in or not), the authorization request's parameters and the callback's answer."""
    provider.user = claims
    browser = Client()
    page = browser.get("/login/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Sign in with Lab SSO" in html
    assert 'name="password"' in html                       # local accounts sign in there too
    # The button's form is sent on to the provider: the page's policy lets it go there.
    assert directives(page["Content-Security-Policy"])["form-action"] == ["'self'", provider.issuer]
    action = unescape(re.search(r'<form method="post" action="([^"]+)"[^>]*class="card narrow sso"', html).group(1))
    to_provider = browser.post(action, {"next": ""})
    assert to_provider.status_code == 302
    authorize = urlsplit(to_provider["Location"])
    assert f"{authorize.scheme}://{authorize.netloc}{authorize.path}" == provider.discovery()["authorization_endpoint"]
    params = {key: values[0] for key, values in parse_qs(authorize.query).items()}
    at_provider = requests.get(to_provider["Location"], allow_redirects=False, timeout=10)
    assert at_provider.status_code == 302, at_provider.text
    back = urlsplit(at_provider.headers["Location"])
    callback = browser.get(back.path, dict(parse_qs(back.query)))
    return browser, params, callback


def signed_in(browser):
    return browser.session.get("_auth_user_id") and get_user_model().objects.get(pk=browser.session["_auth_user_id"])


def claims(sub, username, groups, email=None):
    return {"sub": sub, "preferred_username": username, "email": email or f"{username}@lab.example",
            "email_verified": True, "name": username.title(), "groups": groups}


def test_the_button_leads_to_the_provider_with_pkce_and_a_way_back(provider):
    browser, params, callback = sign_on(provider, claims("sub-dana", "dana", []))
    assert params["client_id"] == provider.client_id
    assert params["response_type"] == "code"
    assert params["code_challenge"] and params["code_challenge_method"] == "S256"
    assert params["redirect_uri"] == "http://testserver/accounts/oidc/sso/login/callback/"
    assert "openid" in params["scope"].split()
    assert callback.status_code == 302 and callback["Location"] == "/"
    user = signed_in(browser)
    assert user and user.username == "dana" and user.email == "dana@lab.example"
    assert user.socialaccount_set.get().uid == "sub-dana"
    assert browser.get("/").status_code == 200                  # the home page, signed in


def test_the_groups_claim_sets_the_managed_groups_at_every_sign_on(provider):
    interns = Group.objects.create(name="interns")              # made by hand in the admin
    browser, _, callback = sign_on(provider, claims("sub-erin", "erin", ["vision", STAFF]))
    erin = signed_in(browser)
    assert set(erin.groups.values_list("name", flat=True)) == {"vision", STAFF}
    assert erin.is_staff
    erin.groups.add(interns)                                    # an admin adds her by hand

    browser, _, _ = sign_on(provider, claims("sub-erin", "erin", ["nlp"]))
    again = signed_in(browser)
    assert again.pk == erin.pk                                  # the same subject, the same account
    assert set(again.groups.values_list("name", flat=True)) == {"nlp", "interns"}
    assert not again.is_staff                                   # the directory gave it and took it back
    assert Group.objects.filter(name="vision").exists()         # the group stays, for its other members


def test_a_deactivated_account_is_not_signed_in_through_the_provider(provider):
    browser, _, _ = sign_on(provider, claims("sub-gil", "gil", ["vision"]))
    gil = signed_in(browser)
    gil.is_active = False
    gil.save()
    browser, _, callback = sign_on(provider, claims("sub-gil", "gil", ["vision"]))
    assert callback.status_code == 302 and callback["Location"] == "/accounts/inactive/"
    assert not signed_in(browser)


def test_the_admin_shows_which_groups_the_directory_keeps(provider, admin_client):
    Group.objects.create(name="by-hand")
    sign_on(provider, claims("sub-hal", "hal", ["vision"]))
    page = admin_client.get("/admin/auth/group/").content.decode()
    assert re.search(r'vision</a></th><td class="field-kept_by_directory"><img[^>]*alt="True"', page)
    assert re.search(r'by-hand</a></th><td class="field-kept_by_directory"><img[^>]*alt="False"', page)


def test_staff_given_by_hand_is_kept_when_the_claim_never_named_the_staff_group(provider, make_user):
    browser, _, _ = sign_on(provider, claims("sub-fay", "fay", ["vision"]))
    fay = signed_in(browser)
    fay.is_staff = True
    fay.save()
    browser, _, _ = sign_on(provider, claims("sub-fay", "fay", []))
    fay.refresh_from_db()
    assert fay.is_staff and not fay.groups.exists()


def test_a_new_subject_with_a_local_accounts_email_does_not_take_it_over(provider, make_user):
    carol = make_user("carol", email="carol@lab.example")
    browser, _, callback = sign_on(provider, claims("sub-mallory", "carol", ["vision"], email="carol@lab.example"))
    assert callback.status_code == 302
    newcomer = signed_in(browser)
    assert newcomer and newcomer.pk != carol.pk                 # an account of its own
    assert not carol.socialaccount_set.exists() and not carol.groups.exists()
    # carol's password still signs her in, on the same login page.
    local = Client().post("/login/", {"username": "carol", "password": "pw-carol"})
    assert local.status_code == 302 and local["Location"] == "/"


def test_no_password_sign_up_and_no_button_without_a_provider(settings, client):
    settings.SOCIALACCOUNT_PROVIDERS = oidc_providers("", "", "", "")
    page = client.get("/login/").content.decode()
    assert "Sign in with" not in page and 'name="password"' in page
    assert directives(client.get("/login/")["Content-Security-Policy"])["form-action"] == ["'self'"]
    assert client.get("/accounts/signup/").status_code == 404
    assert client.get("/accounts/password/reset/").status_code == 404


def test_the_provider_comes_from_the_environment(tmp_path):
    """The settings' contract: RINGMASTER_OIDC_* make one provider, discovered at the issuer."""
    env = {**os.environ, "RINGMASTER_DATA_DIR": str(tmp_path), "RINGMASTER_OIDC_ISSUER": "https://id.lab.example/realms/lab/",
           "RINGMASTER_OIDC_CLIENT_ID": "portal", "RINGMASTER_OIDC_CLIENT_SECRET": "shh",
           "RINGMASTER_OIDC_NAME": "Lab Keycloak", "RINGMASTER_OIDC_GROUPS_CLAIM": "teams",
           "RINGMASTER_OIDC_STAFF_GROUP": "admins"}
    out = subprocess.run([sys.executable, "-c", "import json, portal.settings as s; print(json.dumps(["
                          "s.SOCIALACCOUNT_PROVIDERS, s.RINGMASTER_OIDC_GROUPS_CLAIM, s.RINGMASTER_OIDC_STAFF_GROUP]))"],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    providers, groups_claim, staff = json.loads(out)
    app = providers["openid_connect"]["APPS"][0]
    assert providers["openid_connect"]["OAUTH_PKCE_ENABLED"] is True
    assert (app["name"], app["client_id"], app["secret"]) == ("Lab Keycloak", "portal", "shh")
    assert app["settings"]["server_url"] == "https://id.lab.example/realms/lab"
    assert (groups_claim, staff) == ("teams", "admins")


def test_the_groups_claim_is_read_where_the_provider_puts_it(settings):
    """The claim's values from userinfo, else the ID token (allauth keeps both), else a SAML-like
    provider's attributes; one string is one group; what cannot be a group's name is left out."""
    from jobs.domain.directory import claim_values
    from jobs.web.sso import claims as claims_of

    settings.RINGMASTER_OIDC_GROUPS_CLAIM = "teams"
    assert claim_values(claims_of({"id_token": {"teams": ["vision"]}, "userinfo": {"sub": "x"}})) == ["vision"]
    assert claim_values(claims_of({"id_token": {"teams": ["old"]}, "userinfo": {"teams": ["nlp"]}})) == ["nlp"]
    assert claim_values(claims_of({"teams": "vision"})) == ["vision"]
    assert claim_values({"teams": [" vision ", "", 7, "x" * 151, "vision"]}) == ["vision"]
    assert claim_values({"groups": ["vision"]}) == [] and claim_values({"teams": {"a": 1}}) == []
