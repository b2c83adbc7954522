"""Markers that say a process of `make run` is up: the Celery worker and beat touch
DATA_DIR/run/<name>.ready when they are ready to work; `manage.py ready_banner` waits for them."""
import os

from django.conf import settings


def marker(name):
    return settings.DATA_DIR / "run" / f"{name}.ready"


def mark_ready(name):
    path = marker(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{os.getpid()}\n")
