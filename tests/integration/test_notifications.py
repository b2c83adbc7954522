"""A job's end reaches a webhook with real parts: the job submitted over HTTP to uvicorn and run
by the session's real Celery worker, which also delivers the notification (retried by Celery)
to a receiver on loopback that this test runs, in a network the admin allowed."""
import hashlib
import hmac
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model

from jobs.models import NotificationDelivery, NotifyAllowedNetwork, State
from jobs.web.notify_forms import TargetForm
from tests.conftest import wait_for
from tests.integration.test_job_lifecycle import submit, upload, wait_state

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
SECRET = "the receivers-own-secret"


class Receiver(ThreadingHTTPServer):
    """Counts each connection and records each POST (path, headers, body); answers 500 to the
    first `fail_first`, 200 to the others; given `redirect` ((status, location)), that redirect."""

    def __init__(self, fail_first=1, host="127.0.0.1", redirect=None, port=0):
        self.requests, self.connections, self.lock = [], 0, threading.Lock()
        self.fail_first, self.redirect = fail_first, redirect
        super().__init__((host, port), _Handler)

    @property
    def url(self):
        return f"http://{self.server_address[0]}:{self.server_address[1]}/hooks/ringmaster?team=ml"

    def verify_request(self, request, client_address):
        with self.lock:
            self.connections += 1
        return True


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.requests.append((self.path, dict(self.headers), body))
            failing = len(self.server.requests) <= self.server.fail_first
        if self.server.redirect:
            status, location = self.server.redirect
            self.send_response(status)
            self.send_header("Location", location)
        else:
            self.send_response(500 if failing else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def serve(fail_first=1, host="127.0.0.1", redirect=None, port=0):
    """A Receiver on loopback (`host`: 127.0.0.1, or another of 127.0.0.0/8; `port` 0: a free
    one), serving from a thread of this process until shut down."""
    server = Receiver(fail_first, host, redirect, port)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


@pytest.fixture
def receiver():
    server = serve()
    yield server
    server.shutdown()
    server.server_close()


def test_an_ended_job_posts_one_signed_webhook_retried_after_a_500(http, receiver):
    NotifyAllowedNetwork.objects.create(network="127.0.0.0/8", note="the test's receiver")
    alice = get_user_model().objects.get(username="alice")
    form = TargetForm(data={"kind": "webhook", "address": receiver.url, "secret": SECRET})
    assert form.is_valid(), form.errors
    target, _ = form.save(alice)

    job_id = submit(http, gpus=1, script=upload(http), args=["--lines", "1"], name="notified")
    assert wait_state(job_id, {State.SUCCEEDED, State.FAILED, State.CANCELLED}).state == State.SUCCEEDED

    delivery = wait_for(lambda: NotificationDelivery.objects.filter(target=target, status="delivered").first(),
                        timeout=60, message="the webhook to be delivered")
    assert delivery.attempts == 2 and delivery.job_id == job_id and delivery.event == "ended"
    assert NotificationDelivery.objects.filter(job_id=job_id).count() == 1
    assert len(receiver.requests) == 2                      # the 500, then the retry
    for path, headers, body in receiver.requests:
        assert path == "/hooks/ringmaster?team=ml"
        expected = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["X-Ringmaster-Signature"], f"sha256={expected}")
        assert headers["Content-Type"] == "application/json" and headers["X-Ringmaster-Event"] == "ended"
        assert headers["X-Ringmaster-Delivery"] == str(delivery.pk)
        sent = json.loads(body)
        assert sent["event"] == "ended" and sent["title"] == "notified succeeded"
        assert (sent["job"]["id"], sent["job"]["state"], sent["job"]["exit_code"]) == (job_id, "SUCCEEDED", 0)
    assert receiver.requests[0][2] == receiver.requests[1][2]
