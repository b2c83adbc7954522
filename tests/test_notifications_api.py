"""/api/notifications/ (issue 44's left-overs): a user reads and changes their notification
preferences and targets through the API, checked as the settings page checks them (an address
on a private network refused on `address`), the address stored encrypted and shown masked, a
made webhook secret shown in the creating answer only, Send test and the delivery log; another
user's target is 404; neither an address nor a secret reaches the log."""
import logging

import pytest
from django.core import mail
from rest_framework.test import APIClient

from jobs.models import NotificationDelivery, NotificationPreferences, NotificationTarget, NotifyAllowedNetwork

pytestmark = pytest.mark.django_db

BASE = "/api/notifications/"
TARGETS = "/api/notifications/targets/"


@pytest.fixture
def api(alice, api_client):
    return api_client(alice)


def add(api, **fields):
    return api.post(TARGETS, fields, format="json")


def test_preferences_read_with_their_defaults_and_a_patch_changes_only_what_it_names(api, alice):
    assert api.get(BASE).json() == {"preferences": {"on_end": True, "on_wait": False, "wait_minutes": 30,
                                                    "on_idle": False, "idle_minutes": 30}, "targets": []}
    response = api.patch(BASE, {"on_wait": True, "wait_minutes": 45}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["preferences"] == {"on_end": True, "on_wait": True, "wait_minutes": 45,
                                              "on_idle": False, "idle_minutes": 30}
    response = api.patch(BASE, {"on_end": False}, format="json")
    assert response.json()["preferences"]["on_end"] is False
    prefs = NotificationPreferences.objects.get(user=alice)
    assert (prefs.on_end, prefs.on_wait, prefs.wait_minutes, prefs.on_idle, prefs.idle_minutes) == (
        False, True, 45, False, 30)


@pytest.mark.parametrize("change, field", [
    ({"wait_minutes": 0}, "wait_minutes"),
    ({"idle_minutes": 7 * 24 * 60 + 1}, "idle_minutes"),
    ({"idle_minutes": "soon"}, "idle_minutes"),
    ({"on_idle": "yes"}, "on_idle"),
    ({"colour": "red"}, "colour"),
])
def test_a_bad_preference_is_a_400_naming_it_and_changes_nothing(api, alice, change, field):
    response = api.patch(BASE, {"on_wait": True, **change}, format="json")
    assert response.status_code == 400
    assert list(response.json()) == [field] and response.json()[field][0]
    assert not NotificationPreferences.objects.filter(user=alice).exists()


def test_a_body_that_is_no_object_is_a_400(api):
    assert api.patch(BASE, [1], format="json").json() == {"non_field_errors": ["Send a JSON object."]}
    assert api.post(TARGETS, "x", format="json").status_code == 400


def test_an_e_mail_target_is_stored_encrypted_and_listed_masked(api, alice):
    response = add(api, kind="email", name="my mail", address="alice@example.com")
    assert response.status_code == 201, response.content
    made = response.json()
    assert (made["kind"], made["name"], made["address"], made["last_delivery"]) == (
        "email", "my mail", "a…@example.com", None)
    assert "secret" not in made
    target = NotificationTarget.objects.get(owner=alice)
    assert made["id"] == target.pk
    assert "alice@example.com" not in target.address_encrypted and target.address() == "alice@example.com"

    for listed in (api.get(BASE), api.get(TARGETS), api.get(f"{TARGETS}{target.pk}/")):
        assert "alice@example.com" not in listed.content.decode()
    assert [t["address"] for t in api.get(BASE).json()["targets"]] == ["a…@example.com"]


@pytest.mark.parametrize("address, words", [
    ("http://127.0.0.1:8080/hook", "loopback"),
    ("https://10.1.2.3/hook", "private"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://localhost:8080/hook", "localhost resolves to"),
])
def test_a_webhook_on_this_machine_or_a_private_network_is_refused_on_address(api, address, words):
    response = add(api, kind="webhook", address=address)
    assert response.status_code == 400
    assert list(response.json()) == ["address"] and words in response.json()["address"][0]
    assert not NotificationTarget.objects.exists()


@pytest.mark.parametrize("fields, field", [
    ({"kind": "email", "address": "not-an-address"}, "address"),
    ({"kind": "apprise", "address": "json://10.0.0.5:8080/hook"}, "address"),
    ({"kind": "pigeon", "address": "alice@example.com"}, "kind"),
    ({"kind": "email"}, "address"),
    ({"kind": "email", "address": "alice@example.com", "colour": "red"}, "colour"),
])
def test_a_bad_target_is_a_400_naming_the_field(api, fields, field):
    response = api.post(TARGETS, fields, format="json")
    assert response.status_code == 400
    assert list(response.json()) == [field], response.json()
    assert not NotificationTarget.objects.exists()


def test_a_made_webhook_secret_is_in_the_creating_answer_only_and_no_secret_is_logged(api, alice, caplog):
    caplog.set_level(logging.DEBUG)
    NotifyAllowedNetwork.objects.create(network="127.0.0.0/8")
    response = add(api, kind="webhook", address="http://127.0.0.1:9/hook?token=abc123")
    assert response.status_code == 201, response.content
    target = NotificationTarget.objects.get(owner=alice)
    secret = response.json()["secret"]
    assert len(secret) == 64 and secret == target.secret() and secret not in target.secret_encrypted
    assert response.json()["address"] == "http://127.0.0.1:9/…"
    for later in (api.get(BASE), api.get(TARGETS), api.get(f"{TARGETS}{target.pk}/")):
        assert secret not in later.content.decode() and "abc123" not in later.content.decode()

    own = add(api, kind="webhook", address="http://127.0.0.1:9/other?token=def456", secret="our-own-key")
    assert own.status_code == 201 and "secret" not in own.json()
    add(api, kind="webhook", address="https://10.9.9.9/hook?token=ghi789", secret="refused-key")     # a 400
    api.post(f"{TARGETS}{target.pk}/test/")
    for word in (secret, "our-own-key", "refused-key", "abc123", "def456", "ghi789"):
        assert word not in caplog.text


def test_send_test_e_mails_and_the_delivery_log_lists_it(api, alice):
    target_id = add(api, kind="email", address="alice@example.com").json()["id"]
    response = api.post(f"{TARGETS}{target_id}/test/")
    assert response.status_code == 200, response.content
    sent = response.json()
    assert (sent["event"], sent["status"], sent["attempts"], sent["job"]) == ("test", "delivered", 1, None)
    assert [message.to for message in mail.outbox] == [["alice@example.com"]]

    log = api.get(f"{TARGETS}{target_id}/deliveries/").json()
    assert log["count"] == 1 and [d["id"] for d in log["results"]] == [sent["id"]]
    assert api.get(BASE).json()["targets"][0]["last_delivery"]["id"] == sent["id"]
    api.post(f"{TARGETS}{target_id}/test/")
    page = api.get(f"{TARGETS}{target_id}/deliveries/?limit=1").json()
    assert page["count"] == 2 and page["results"][0]["id"] > sent["id"] and page["next"]
    assert api.get(f"{TARGETS}{target_id}/deliveries/?limit=0").status_code == 400


def test_a_test_that_cannot_be_delivered_says_why(api):
    NotifyAllowedNetwork.objects.create(network="127.0.0.0/8")
    target_id = add(api, kind="webhook", address="http://127.0.0.1:9/hook").json()["id"]
    sent = api.post(f"{TARGETS}{target_id}/test/").json()
    assert sent["status"] == "failed" and sent["detail"]


def test_delete_removes_ones_own_target(api, alice):
    target_id = add(api, kind="email", address="alice@example.com").json()["id"]
    api.post(f"{TARGETS}{target_id}/test/")
    assert api.delete(f"{TARGETS}{target_id}/").status_code == 204
    assert not NotificationTarget.objects.exists() and not NotificationDelivery.objects.exists()
    assert api.delete(f"{TARGETS}{target_id}/").status_code == 404


def test_a_stranger_gets_404_for_anothers_target_and_never_sees_it(api, alice, make_user, api_client):
    target_id = add(api, kind="email", name="alice's mail", address="alice@example.com").json()["id"]
    bob = api_client(make_user("bob", is_staff=True))
    for method, path in (("get", ""), ("delete", ""), ("post", "test/"), ("get", "deliveries/")):
        response = getattr(bob, method)(f"{TARGETS}{target_id}/{path}")
        assert response.status_code == 404, (method, path)
    assert bob.get(BASE).json()["targets"] == [] and bob.get(TARGETS).json() == []
    assert NotificationTarget.objects.filter(pk=target_id).exists()
    assert not mail.outbox and not NotificationDelivery.objects.exists()


def test_without_credentials_every_endpoint_is_refused(alice):
    anonymous = APIClient()
    for method, path in (("get", BASE), ("patch", BASE), ("get", TARGETS), ("post", TARGETS),
                         ("delete", f"{TARGETS}1/"), ("post", f"{TARGETS}1/test/"), ("get", f"{TARGETS}1/deliveries/")):
        assert getattr(anonymous, method)(path).status_code in (401, 403), (method, path)


def test_the_endpoints_are_in_the_openapi_schema(api):
    paths = api.get("/api/schema/?format=json").json()["paths"]
    assert set(paths["/api/notifications/"]) >= {"get", "patch"}
    assert set(paths["/api/notifications/targets/"]) >= {"get", "post"}
    assert set(paths["/api/notifications/targets/{target_id}/"]) >= {"get", "delete"}
    assert "post" in paths["/api/notifications/targets/{target_id}/test/"]
    assert "get" in paths["/api/notifications/targets/{target_id}/deliveries/"]
