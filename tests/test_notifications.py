"""Notifications (issue 44, part 3): targets on the settings page (refused where they point at
this machine or a private network, another user's a 404), Send test, e-mail through Django's
mail (the locmem outbox here), and the events: a job's end (from the state machine, once),
a long wait and idle GPUs (beat's check, once a job). Issue 58: a delivery connects only to the
address its host was checked at and follows no redirect (loopback listeners that must see nothing)."""
import ipaddress
import json
import socket
import sys
import types
from datetime import timedelta

import pytest
from django.core import mail
from django.test import Client
from django.utils import timezone

from jobs import taskqueue, tasks
from jobs.domain import destinations, notifications, notify_send, states
from jobs.models import (
    Job, JobNotice, NotificationDelivery, NotificationPreferences, NotificationTarget, NotifyAllowedNetwork, State,
    SystemSample,
)
from tests.integration.test_notifications import serve

pytestmark = pytest.mark.django_db


def add_target(client, address, kind="webhook", **fields):
    return client.post("/settings/", {"action": "add-target", "kind": kind, "address": address, **fields})


@pytest.mark.parametrize("address, words", [
    ("http://127.0.0.1:8080/hook", "loopback"),
    ("https://10.1.2.3/hook", "private"),
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://[::1]/hook", "loopback"),
    ("http://[::ffff:10.0.0.1]/hook", "private"),
    ("http://localhost:8080/hook", "localhost resolves to"),
])
def test_a_webhook_on_this_machine_or_a_private_network_is_refused_naming_the_field(client, alice, address, words):
    client.force_login(alice)
    response = add_target(client, address)
    page = response.content.decode()
    assert response.status_code == 400
    assert 'data-field="address"' in page and words in page
    assert not NotificationTarget.objects.exists()


def test_an_apprise_url_is_checked_alike_and_one_apprise_does_not_know_is_refused(client, alice):
    client.force_login(alice)
    refused = add_target(client, "json://10.0.0.5:8080/hook", kind="apprise")
    assert refused.status_code == 400 and "private" in refused.content.decode()
    unknown = add_target(client, "nosuchservice://abc", kind="apprise")
    assert unknown.status_code == 400 and 'data-field="address"' in unknown.content.decode()
    local = add_target(client, "syslog://", kind="apprise")
    assert local.status_code == 400 and 'data-field="address"' in local.content.decode()
    for unpinned in ("rsyslog://example.com", "irc://nick@irc.example.com/#ml"):   # their own protocols
        response = add_target(client, unpinned, kind="apprise")
        assert response.status_code == 400 and 'data-field="address"' in response.content.decode()
        assert "cannot be held to the address" in response.content.decode()
    bad_mail = add_target(client, "not-an-address", kind="email")
    assert bad_mail.status_code == 400 and 'data-field="address"' in bad_mail.content.decode()
    assert not NotificationTarget.objects.exists()


def test_an_admin_allows_a_network_in_the_admin_or_the_settings(client, alice, settings):
    client.force_login(alice)
    NotifyAllowedNetwork.objects.create(network="127.0.0.0/8")
    assert add_target(client, "http://127.0.0.1:8080/hook").status_code == 200     # its secret, shown once
    assert add_target(client, "http://10.1.2.3/hook").status_code == 400
    settings.RINGMASTER_NOTIFY_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    assert add_target(client, "http://10.1.2.3/hook", secret="our-secret").status_code == 302
    assert NotificationTarget.objects.filter(owner=alice).count() == 2


def test_every_range_that_is_not_the_internets_is_refused_and_the_internet_is_not():
    for address in ("127.0.0.1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1",
                    "0.0.0.0", "::1", "fe80::1", "fd00::1", "224.0.0.1", "::ffff:127.0.0.1"):
        assert destinations.refused_kind(ipaddress.ip_address(address), allowed=[], own=set()), address
    for address in ("8.8.8.8", "2606:4700:4700::1111"):
        assert destinations.refused_kind(ipaddress.ip_address(address), allowed=[], own=set()) == ""
    own = ipaddress.ip_address("203.0.113.7")
    assert "own machine" in destinations.refused_kind(ipaddress.ip_address("8.8.4.4"), allowed=[],
                                                      own={ipaddress.ip_address("8.8.4.4")})
    assert destinations.refused_kind(own, allowed=[ipaddress.ip_network("203.0.113.0/24")], own={own}) == ""


def test_a_stored_target_is_refused_again_at_delivery(client, alice):
    """A network allowed when the target was added and no longer: nothing is sent there."""
    client.force_login(alice)
    allowed = NotifyAllowedNetwork.objects.create(network="127.0.0.0/8")
    add_target(client, "http://127.0.0.1:9/hook")
    allowed.delete()
    target = NotificationTarget.objects.get(owner=alice)
    delivery = notifications.send_test(target)
    assert delivery.status == NotificationDelivery.Status.FAILED and "loopback" in delivery.detail
    assert delivery.attempts == 1


def test_a_delivery_that_fails_is_retried_until_its_last_attempt(alice):
    """Nothing listens on port 1: each attempt fails; all but the last ask Celery to retry."""
    NotifyAllowedNetwork.objects.create(network="127.0.0.0/8")
    target = NotificationTarget(owner=alice, kind="webhook", shown="http://127.0.0.1:1/")
    target.set_address("http://127.0.0.1:1/hook")
    target.set_secret("s")
    target.save()
    delivery = NotificationDelivery.objects.create(target=target, event="test", payload={"title": "t", "text": "t"})
    with pytest.raises(notify_send.Unsent):
        notifications.deliver(delivery.pk, last=False)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("retrying", 1) and "did not answer" in delivery.detail
    notifications.deliver(delivery.pk, last=True)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("failed", 2)


def test_a_stranger_can_neither_see_nor_test_nor_remove_anothers_target(client, alice, make_user):
    target = NotificationTarget(owner=alice, kind="email", shown="a…@example.com", name="alice's mail")
    target.set_address("alice@example.com")
    target.save()
    bob = make_user("bob", is_staff=True)
    client.force_login(bob)
    assert client.get(f"/settings/notifications/{target.pk}/").status_code == 404
    assert client.post(f"/settings/notifications/{target.pk}/test/").status_code == 404
    assert client.post(f"/settings/notifications/{target.pk}/delete/").status_code == 404
    assert "alice's mail" not in client.get("/settings/").content.decode()
    assert NotificationTarget.objects.filter(pk=target.pk).exists() and not mail.outbox
    assert not NotificationDelivery.objects.exists()


def test_send_test_e_mails_and_records_its_status_and_the_address_is_stored_encrypted(client, alice):
    client.force_login(alice)
    assert add_target(client, "alice@example.com", kind="email", name="my mail").status_code == 302
    target = NotificationTarget.objects.get(owner=alice)
    assert "alice@example.com" not in target.address_encrypted and target.address() == "alice@example.com"

    response = client.post(f"/settings/notifications/{target.pk}/test/", follow=True)
    assert [message.to for message in mail.outbox] == [["alice@example.com"]]
    assert "test notification" in mail.outbox[0].subject
    assert "Test message delivered" in response.content.decode()
    delivery = NotificationDelivery.objects.get(target=target)
    assert (delivery.event, delivery.status, delivery.attempts) == ("test", "delivered", 1)
    row = response.content.decode().split(f'data-target="{target.pk}"')[1].split("</tr>")[0]
    assert "delivered" in row and "test" in row
    log = client.get(f"/settings/notifications/{target.pk}/").content.decode()
    assert f'data-delivery="{delivery.pk}"' in log

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(alice)
    assert strict.post(f"/settings/notifications/{target.pk}/test/").status_code == 403
    assert strict.post(f"/settings/notifications/{target.pk}/delete/").status_code == 403
    assert len(mail.outbox) == 1

    client.post(f"/settings/notifications/{target.pk}/delete/")
    assert not NotificationTarget.objects.exists()


def test_send_test_reaches_a_chat_server_through_apprise(client, alice):
    """Apprise's JSON plugin (json://, as a self-hosted chat bridge would be) to a receiver on
    loopback, which the admin allowed; its 500 is recorded as a failed test."""
    client.force_login(alice)
    NotifyAllowedNetwork.objects.create(network="127.0.0.0/8")
    server = serve(fail_first=1)
    try:
        add_target(client, f"json://127.0.0.1:{server.server_address[1]}/chat", kind="apprise")
        target = NotificationTarget.objects.get(owner=alice)
        assert target.shown == f"json://127.0.0.1:{server.server_address[1]}/chat"
        failed = client.post(f"/settings/notifications/{target.pk}/test/", follow=True).content.decode()
        assert "not delivered" in failed and "500" in failed
        client.post(f"/settings/notifications/{target.pk}/test/")
    finally:
        server.shutdown()
        server.server_close()
    assert [d.status for d in NotificationDelivery.objects.filter(target=target).order_by("id")] == ["failed",
                                                                                                    "delivered"]
    sent = [json.loads(body) for _, _, body in server.requests]
    assert len(sent) == 2 and sent[1]["title"] == "Ringmaster test notification"


def apprise_target(owner, url):
    target = NotificationTarget(owner=owner, kind="apprise", shown=url)
    target.set_address(url)
    target.save()
    return target


def stop(*servers):
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status", [302, 307])
def test_an_apprise_target_that_redirects_to_a_refused_address_is_not_delivered_there(client, alice, settings,
                                                                                      status):
    """A json:// target on an allowed address answers with a redirect to a loopback address that
    no network allows: that address sees no connection, and the log says a redirect was refused,
    nothing of what answered."""
    settings.RINGMASTER_NOTIFY_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    inside = serve(host="127.0.0.2")
    outside = serve(redirect=(status, f"http://127.0.0.2:{inside.server_address[1]}/internal"))
    try:
        client.force_login(alice)
        url = f"json://127.0.0.1:{outside.server_address[1]}/chat"
        assert add_target(client, url, kind="apprise").status_code == 302
        delivery = notifications.send_test(NotificationTarget.objects.get(owner=alice))
    finally:
        stop(inside, outside)
    assert len(outside.requests) == 1
    assert inside.connections == 0
    assert (delivery.status, delivery.detail) == ("failed", "refused: redirect")


def test_a_webhook_that_redirects_is_refused_alike(alice, settings):
    """A webhook's log says the same of a redirect: not what the host answered."""
    settings.RINGMASTER_NOTIFY_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    inside = serve(host="127.0.0.2")
    outside = serve(redirect=(307, f"http://127.0.0.2:{inside.server_address[1]}/internal"))
    target = NotificationTarget(owner=alice, kind="webhook", shown="http://127.0.0.1/")
    target.set_address(outside.url)
    target.set_secret("s")
    target.save()
    try:
        delivery = notifications.send_test(target)
    finally:
        stop(inside, outside)
    assert (len(outside.requests), inside.connections) == (1, 0)
    assert (delivery.status, delivery.detail) == ("failed", "refused: redirect")


def test_an_apprise_host_name_is_resolved_once_and_connected_to_where_it_was_checked(alice, settings, monkeypatch):
    """DNS rebinding: a name whose first answer is an allowed address and every later one a
    refused address. The delivery checks the first answer and connects there; the refused
    address sees no connection. (The resolver is the one part faked: a DNS server that changes
    its answer cannot run here without changing the machine's resolver.)"""
    settings.RINGMASTER_NOTIFY_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    allowed = serve(fail_first=0)
    port = allowed.server_address[1]
    refused = serve(host="127.0.0.2", port=port)           # where a second lookup would connect
    answers, real = iter(["127.0.0.1"]), socket.getaddrinfo

    def rebinding(host, *args, **kwargs):
        if host == "chat.rebinding.test":
            host = next(answers, "127.0.0.2")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    target = apprise_target(alice, f"json://chat.rebinding.test:{port}/chat")
    try:
        delivery = notifications.send_test(target)
    finally:
        stop(allowed, refused)
    assert refused.connections == 0
    assert delivery.status == "delivered" and len(allowed.requests) == 1
    assert json.loads(allowed.requests[0][2])["title"] == "Ringmaster test notification"
    assert allowed.requests[0][1]["Host"] == f"chat.rebinding.test:{port}"


def test_every_apprise_plugin_that_is_not_sent_over_requests_is_refused():
    """The installed Apprise's plugins that reach their server without requests (a socket, SMTP,
    TLS of their own), whose connections PinnedAdapter cannot hold, are all in notify_send's sets
    of plugins not sent (a new Apprise release's new protocol shows here)."""
    from apprise.manager_plugins import NotificationManager

    transports = ("socket", "ssl", "smtplib", "asyncio", "paho", "slixmpp", "gntp", "smpplib", "apprise.utils.socket")
    refused = notify_send.LOCAL_PLUGINS | notify_send.UNPINNED_PLUGINS
    manager = NotificationManager()
    manager.load_modules()
    for plugin in set(manager.plugins()):
        homes = {tuple(cls.__module__.split(".")[:3]) for cls in plugin.__mro__    # apprise.plugins.<module or package>
                 if cls.__module__.startswith("apprise.plugins.") and cls.__module__ != "apprise.plugins.base"}
        modules = [module for name, module in list(sys.modules.items()) if tuple(name.split(".")[:3]) in homes]
        used = {value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", "")
                for module in modules for value in vars(module).values()}
        by_requests = "requests" in used and not any(name == t or name.startswith(f"{t}.") for name in used
                                                     for t in transports)
        assert by_requests or plugin.__module__.split(".")[2] in refused, plugin.__module__


def test_a_webhook_secret_is_made_and_shown_once_and_stored_encrypted(client, alice):
    client.force_login(alice)
    NotifyAllowedNetwork.objects.create(network="127.0.0.0/8")
    response = add_target(client, "http://127.0.0.1:9/hook")
    target = NotificationTarget.objects.get(owner=alice)
    secret = target.secret()
    assert len(secret) == 64 and f'value="{secret}"' in response.content.decode()
    assert secret not in target.secret_encrypted and "127.0.0.1:9/hook" not in target.address_encrypted
    assert secret not in client.get("/settings/").content.decode()


def end_job(job, state=State.SUCCEEDED):
    for step in (State.LAUNCHING, State.RUNNING, state):
        states.transition(job.pk, step)


@pytest.fixture
def mail_target(alice):
    target = NotificationTarget(owner=alice, kind="email", shown="a…@example.com")
    target.set_address("alice@example.com")
    target.save()
    return target


def make_job(owner, image, **fields):
    return Job.objects.create(owner=owner, image=image, gpus=1, script_path="train.py", time_limit_minutes=60,
                              name="resnet", **fields)


def test_an_ended_job_is_e_mailed_once_through_the_delivery_task(alice, image, mail_target,
                                                                 django_capture_on_commit_callbacks):
    job = make_job(alice, image)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        end_job(job, State.FAILED)
    assert taskqueue.sent(callbacks).count("deliver_notification") == 1
    delivery = NotificationDelivery.objects.get(job=job)
    assert delivery.status == "queued" and delivery.payload["job"]["state"] == "FAILED"

    tasks.deliver_notification.apply(args=[delivery.pk])          # Celery's eager path, in this process
    assert len(mail.outbox) == 1 and mail.outbox[0].subject == "resnet failed"
    assert f"/jobs/{job.pk}/" in mail.outbox[0].body
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts) == ("delivered", 1)
    tasks.deliver_notification.apply(args=[delivery.pk])          # a duplicate task sends nothing more
    assert len(mail.outbox) == 1


def test_no_notification_of_an_end_the_user_did_not_ask_for(alice, image, mail_target,
                                                            django_capture_on_commit_callbacks):
    NotificationPreferences.objects.create(user=alice, on_end=False)
    job = make_job(alice, image)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        end_job(job, State.SUCCEEDED)
    assert "deliver_notification" not in taskqueue.sent(callbacks)
    assert not NotificationDelivery.objects.exists()


def test_a_long_wait_is_announced_once(alice, image, mail_target, django_capture_on_commit_callbacks):
    NotificationPreferences.objects.create(user=alice, on_wait=True, wait_minutes=20)
    waiting, fresh = make_job(alice, image), make_job(alice, image)
    now = timezone.now()
    Job.objects.filter(pk=waiting.pk).update(created_at=now - timedelta(minutes=25))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert notifications.check(now) == 1
        assert notifications.check(now + timedelta(minutes=5)) == 0
    assert taskqueue.sent(callbacks) == ["deliver_notification"]
    delivery = NotificationDelivery.objects.get()
    assert (delivery.job_id, delivery.event) == (waiting.pk, "waiting")
    assert "has waited 25 minutes" in delivery.payload["title"]
    assert not JobNotice.objects.filter(job=fresh).exists()


def test_idle_gpus_are_announced_once_and_busy_ones_not(alice, image, mail_target, settings):
    settings.RINGMASTER_NOTIFY_IDLE_BELOW_PERCENT = 10
    NotificationPreferences.objects.create(user=alice, on_end=False, on_idle=True, idle_minutes=30)
    now = timezone.now()
    idle, busy, young = (make_job(alice, image, state=State.RUNNING, started_at=now - timedelta(minutes=minutes))
                         for minutes in (45, 45, 10))
    for job, busy_at in ((idle, None), (busy, 12), (young, None)):
        for minute in range(0, 32, 2):              # every GPU sample of the last 31 minutes
            for gpu in (0, 1):
                SystemSample.objects.create(job=job, ts=now - timedelta(minutes=minute), host="h", device=f"gpu{gpu}",
                                            utilization=55.0 if minute == busy_at and gpu == 1 else 3.0)
    assert notifications.check(now) == 1
    assert notifications.check(now + timedelta(minutes=1)) == 0
    delivery = NotificationDelivery.objects.get()
    assert (delivery.job_id, delivery.event) == (idle.pk, "idle") and "idle" in delivery.payload["title"]


def test_preferences_are_set_on_the_settings_page(client, alice):
    client.force_login(alice)
    response = client.post("/settings/", {"action": "notify-preferences", "on_end": "on", "on_wait": "on",
                                          "wait_minutes": "0", "idle_minutes": "30"})
    assert response.status_code == 400 and 'data-field="wait_minutes"' in response.content.decode()
    client.post("/settings/", {"action": "notify-preferences", "on_wait": "on", "wait_minutes": "45",
                               "idle_minutes": "30"})
    prefs = NotificationPreferences.objects.get(user=alice)
    assert (prefs.on_end, prefs.on_wait, prefs.wait_minutes, prefs.on_idle) == (False, True, 45, False)
