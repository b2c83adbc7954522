"""The web server and the worker leave their start-up objects out of the garbage collector's
full passes (portal.heap): a full collection then stops a follower's or the websocket server's
threads for the objects made since, not for all of Django (84-91 ms in the ingest benchmark)."""
import json
import os
import subprocess
import sys

from tests.conftest import ROOT

# Django, DRF, Channels and Celery alone are far more objects than this.
STARTUP_OBJECTS = 50_000


def frozen_after(code, tmp_path):
    """gc.get_freeze_count() after `code` runs in a fresh interpreter, as `make run` configures it."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(RINGMASTER_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="portal.settings", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code + "\nimport gc, json; print(json.dumps(gc.get_freeze_count()))"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_web_application_freezes_what_start_up_made(tmp_path):
    assert frozen_after("import portal.asgi", tmp_path) > STARTUP_OBJECTS


def test_the_worker_freezes_what_start_up_made_once_it_is_ready(tmp_path):
    code = ("import gc, django; from portal.celery import app; django.setup(); app.loader.import_default_modules()\n"
            "assert gc.get_freeze_count() == 0\n"
            "from celery.signals import worker_ready; worker_ready.send(sender=None)")
    assert frozen_after(code, tmp_path) > STARTUP_OBJECTS
    assert (tmp_path / "run" / "worker.ready").exists()
