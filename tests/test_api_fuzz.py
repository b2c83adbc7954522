"""Generated requests to every API operation (tests/api_fuzzing.py) on both databases the portal
runs on, each already holding jobs, log lines and metrics: none may get a server error, and every
answer must be what the schema says (a documented status code, content type and body)."""
import json
import os
import subprocess
import sys

import pytest

from tests import api_fuzzing
from tests.conftest import ROOT

EXAMPLES = 20           # random requests per operation and database, after the coverage phase's
# The embedded run takes about 7 s on an idle machine, several times that under `make test`'s
# load; its process is killed past this, before pytest's own limit (300 s) ends the test.
EMBEDDED_SECONDS = 240


@pytest.mark.django_db
def test_generated_requests_on_postgresql_never_get_a_server_error(make_user, image):
    from django.core import signals
    from django.core.wsgi import get_wsgi_application
    from django.db import close_old_connections
    from jobs.domain import tokens

    alice = make_user("alice")
    api_fuzzing.seed(alice, image)
    headers = {"Authorization": f"Token {tokens.issue(alice).key}"}
    # As Django's test client does: the test's transaction holds the data, so requests must not
    # close the connection when they end.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        failures = api_fuzzing.fuzz(get_wsgi_application(), headers, EXAMPLES, api_fuzzing.RUNNING_JOB)
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
    assert failures == []


def test_generated_requests_on_the_embedded_sqlite_portal_never_get_a_server_error(tmp_path):
    """The portal as `make run` starts it with no settings (SQLite in its data folder), in a
    process of its own: this one's Django is configured for the test database."""
    env = {name: os.environ[name] for name in ("PATH", "HOME", "LANG", "TMPDIR") if name in os.environ}
    env.update({
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "PYTHONPATH": str(ROOT),
        "RINGMASTER_DATA_DIR": str(tmp_path),
        "RINGMASTER_NVIDIA_SMI": str(tmp_path / "no-nvidia-smi"),   # the same on a machine with GPUs
    })
    run = subprocess.run([sys.executable, "-m", "tests.api_fuzzing", str(tmp_path), str(EXAMPLES)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=EMBEDDED_SECONDS)
    assert run.returncode == 0, run.stderr[-5000:]
    assert json.loads((tmp_path / api_fuzzing.FAILURES_FILE).read_text()) == [], run.stderr[-5000:]
