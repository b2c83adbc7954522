"""Sign-in throttling (issue 58, E): five failed sign-ins of an account, or from an address, within
the window are answered as usual; the sixth, and every try until the window has passed since the
last failure, is refused with 429, Retry-After and, on the login pages, a message that says when
to try again. A wrong API token is a failed sign-in of its address. The window is 2 s here.

Each test signs in from addresses of its own (TEST-NET), so no other test's failures count."""
from datetime import timedelta

import pytest
from django.test import Client
from rest_framework.test import APIClient

from jobs.domain import tokens
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db

WINDOW = 2
THROTTLED = "Too many failed sign-ins; try again in"


@pytest.fixture(autouse=True)
def short_window(settings):
    settings.AXES_COOLOFF_TIME = timedelta(seconds=WINDOW)


def log_in(address, username, password, path="/login/"):
    return Client(REMOTE_ADDR=address).post(path, {"username": username, "password": password})


def assert_throttled(response):
    assert response.status_code == 429
    assert 1 <= int(response["Retry-After"]) <= WINDOW
    page = response.content.decode()
    assert THROTTLED in page and (f"{WINDOW} seconds" in page or "1 second" in page)
    assert 'name="password"' in page                          # the login page, not a bare error


def test_the_sixth_wrong_password_is_throttled_and_the_right_one_works_after_the_window(alice):
    for _ in range(5):
        wrong = log_in("192.0.2.1", "alice", "wrong")
        assert wrong.status_code == 200 and "Please enter a correct username and password" in wrong.content.decode()
    assert_throttled(log_in("192.0.2.1", "alice", "wrong"))
    assert_throttled(log_in("192.0.2.1", "alice", "pw-alice"))   # the right one too, while it lasts

    # Tries while refused do not lengthen the window: polling with the right password gets in.
    right = wait_for(lambda: (lambda r: r if r.status_code == 302 else None)(log_in("192.0.2.1", "alice", "pw-alice")),
                     timeout=WINDOW + 8, interval=0.25, message="the right password to work again")
    assert right["Location"] == "/"


def test_an_account_is_throttled_from_every_address_and_an_address_for_every_account(make_user):
    alice, bob = make_user("alice"), make_user("bob")
    for address in ["192.0.2.2"] * 3 + ["192.0.2.3"] * 2:
        assert log_in(address, "alice", "wrong").status_code == 200
    assert_throttled(log_in("192.0.2.3", "alice", "wrong"))      # alice's sixth, from her second address
    assert log_in("192.0.2.3", "bob", "pw-bob").status_code == 302   # that address had 3: bob gets in

    for number in range(5):
        assert log_in("192.0.2.4", f"nobody{number}", "wrong").status_code == 200
    assert_throttled(log_in("192.0.2.4", "nobody5", "wrong"))    # the address's sixth
    assert_throttled(log_in("192.0.2.4", "bob", "pw-bob"))
    assert log_in("192.0.2.5", "bob", "pw-bob").status_code == 302


def test_the_admin_login_is_throttled_on_its_own_page(make_user):
    make_user("root", is_staff=True, is_superuser=True)
    for _ in range(5):
        assert log_in("192.0.2.6", "root", "wrong", path="/admin/login/").status_code == 200
    throttled = log_in("192.0.2.6", "root", "wrong", path="/admin/login/")
    assert_throttled(throttled)
    assert 'id="login-form"' in throttled.content.decode()          # the admin's own login page
    assert_throttled(log_in("192.0.2.6", "root", "pw-root", path="/admin/login/"))


def api(address, key):
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client.get("/api/quota/")


def test_the_sixth_bad_token_from_an_address_is_429_and_the_address_alone_waits(alice):
    key = tokens.issue(alice).key
    for number in range(5):
        assert api("198.51.100.1", f"bad-{number}").status_code == 401
    sixth = api("198.51.100.1", "bad-5")
    assert sixth.status_code == 429 and 1 <= int(sixth["Retry-After"]) <= WINDOW
    assert sixth.json()["detail"].startswith(THROTTLED)
    again = api("198.51.100.1", key)
    assert again.status_code == 429 and 1 <= int(again["Retry-After"]) <= WINDOW   # a good token waits there too
    assert again.json()["detail"] in (f"{THROTTLED} {WINDOW} seconds.", f"{THROTTLED} 1 second.")
    assert api("198.51.100.2", key).status_code == 200              # not elsewhere: no account is named
    wait_for(lambda: api("198.51.100.1", key).status_code == 200, timeout=WINDOW + 8, interval=0.25,
             message="the token to work again from the throttled address")
