"""`make run`'s banner: it waits for the real web server, Celery worker and beat of the session
(each marks itself ready in the data folder), then prints the URL and where the admin's first
password is while that still works, and how to reset it once it does not."""
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, VENV_BIN, Service

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def banner(env, url, timeout=90):
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), "ready_banner", "--url", url, "--exit",
                           "--timeout", str(timeout)], cwd=ROOT, env=env, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout + 60)


def test_the_banner_waits_for_web_worker_and_beat_then_says_how_to_log_in(
        service_env, live_portal, celery_worker, django_user_model, tmp_path):
    data_dir = Path(service_env["RINGMASTER_DATA_DIR"])
    assert (data_dir / "run" / "worker.ready").exists()                     # the real worker marked itself
    (data_dir / "run" / "beat.ready").unlink(missing_ok=True)
    early = banner(service_env, live_portal, timeout=2)
    assert early.returncode != 0 and "not up after 2 s: beat" in early.stderr

    beat = Service("beat", [str(VENV_BIN / "celery"), "-A", "portal", "beat", "--loglevel", "INFO",
                            "--schedule", str(tmp_path / "celerybeat-schedule")], service_env, tmp_path / "beat.log")
    beat.start()
    try:
        admin = django_user_model.objects.create_superuser("admin", password="first-Pass-123")
        (data_dir / "initial_admin_password").write_text("admin\nfirst-Pass-123\n")
        ready = banner(service_env, live_portal)
        assert ready.returncode == 0, ready.stderr + beat.output()
        assert f"Ringmaster is ready at {live_portal}/" in ready.stdout
        # No terminal (a service, nohup): the output, which may be a log, names the file, not the password
        # (with a terminal it goes there: tests/test_secrets_at_rest.py).
        assert f"Log in as admin with the password in {data_dir / 'initial_admin_password'}" in ready.stdout
        assert "first-Pass-123" not in ready.stdout + ready.stderr

        admin.set_password("something-else-456")
        admin.save()
        changed = banner(service_env, live_portal)
        assert "Log in as admin (password changed; reset it: .venv/bin/python manage.py changepassword admin)" \
            in changed.stdout
        assert not (data_dir / "initial_admin_password").exists()           # no stale password kept
    finally:
        beat.stop()
