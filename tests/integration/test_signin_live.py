"""Sign-in throttling as uvicorn serves it (Django's asynchronous middleware path): the sixth wrong
password gets the login page saying when to try again, with 429; wrong tokens on the websocket
count against the address like the API's, and a locked address's good token is refused there.
Each test names its own address (uvicorn takes X-Forwarded-For from 127.0.0.1), so the session's
other tests, which all come from 127.0.0.1, are never locked out."""
import asyncio
import re

import pytest
import requests
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from jobs.domain import tokens
from tests.integration.test_websocket import job, ws_url  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_the_sixth_wrong_password_gets_the_throttle_page(live_portal, make_user):
    make_user("carol")
    session = requests.Session()
    session.headers["X-Forwarded-For"] = "192.0.2.80"

    page = session.get(f"{live_portal}/login/", timeout=10).text
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)

    def log_in(password):
        return session.post(f"{live_portal}/login/", data={"csrfmiddlewaretoken": csrf, "username": "carol",
                                                           "password": password}, allow_redirects=False, timeout=10)

    for _ in range(5):
        assert log_in("wrong").status_code == 200
    refused = log_in("wrong")
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 800
    assert "Too many failed sign-ins; try again in 15 minutes." in refused.text and 'name="password"' in refused.text
    assert log_in("pw-carol").status_code == 429


def test_wrong_tokens_on_the_websocket_lock_the_address_there(live_portal, job, alice):  # noqa: F811
    good = {"Authorization": f"Token {tokens.issue(alice).key}"}

    async def status(headers, address):
        try:
            async with connect(ws_url(live_portal, job), additional_headers={**headers, "X-Forwarded-For": address}):
                return 101
        except InvalidStatus as refused:
            return refused.response.status_code

    assert asyncio.run(status(good, "198.51.100.80")) == 101
    for number in range(6):
        assert asyncio.run(status({"Authorization": f"Token bad-{number}"}, "198.51.100.80")) == 403
    assert asyncio.run(status(good, "198.51.100.80")) == 403          # locked: even the good token
    assert asyncio.run(status(good, "198.51.100.81")) == 101
