"""Secrets after `make run`: the embedded default (no DATABASE_URL) makes the secret key and a
Fernet key once and keeps them in its data folder, so add_instance, add_cluster and the admin can
store secrets out of the box; a deployment with DATABASE_URL must set RINGMASTER_FERNET_KEYS,
and `manage.py migrate`/`check` (what starts it) refuse to go on without it, saying so.

The settings are read by fresh processes with only the environment each case gives."""
import os
import stat
import subprocess
import sys

from tests.conftest import ROOT

SHOW = ("from django.conf import settings; from jobs.secrets import decrypt, encrypt; "
        "print(settings.RINGMASTER_FERNET_KEYS); print(settings.SECRET_KEY); print(decrypt(encrypt('sekrit')))")


def manage(data_dir, *argv, code=SHOW, **env):
    environment = {"PATH": os.environ["PATH"], "HOME": str(data_dir), "RINGMASTER_DATA_DIR": str(data_dir),
                   "DJANGO_SETTINGS_MODULE": "portal.settings", "PYTHONPATH": str(ROOT), **env}
    command = [sys.executable, str(ROOT / "manage.py"), *argv] if argv else [
        sys.executable, "-c", f"import django; django.setup(); {code}"]
    return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120)


def test_the_embedded_default_makes_a_fernet_key_once_and_keeps_it_private(tmp_path):
    first = manage(tmp_path)
    assert first.returncode == 0, first.stderr
    key, secret_key, roundtrip = first.stdout.split()
    assert roundtrip == "sekrit"
    assert (tmp_path / "fernet_key").read_text().strip() == key
    assert stat.S_IMODE((tmp_path / "fernet_key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "secret_key").stat().st_mode) == 0o600
    again = manage(tmp_path)
    assert again.stdout.split()[:2] == [key, secret_key]                 # kept, not made again
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []   # nothing left aside


def test_processes_starting_at_once_agree_on_one_key(tmp_path):
    processes = [subprocess.Popen([sys.executable, "-c", f"import django; django.setup(); {SHOW}"], cwd=ROOT,
                                  env={"PATH": os.environ["PATH"], "RINGMASTER_DATA_DIR": str(tmp_path),
                                       "DJANGO_SETTINGS_MODULE": "portal.settings", "PYTHONPATH": str(ROOT)},
                                  stdout=subprocess.PIPE, text=True) for _ in range(4)]
    keys = {process.communicate(timeout=120)[0].split()[0] for process in processes}
    assert keys == {(tmp_path / "fernet_key").read_text().strip()}


def test_a_deployment_with_a_database_url_refuses_to_start_without_fernet_keys(tmp_path):
    deployed = {"DATABASE_URL": "sqlite:///" + str(tmp_path / "db.sqlite3"), "SECRET_KEY": "x" * 50}
    result = manage(tmp_path, "check", **deployed)
    assert result.returncode != 0
    assert "(ringmaster.E001) RINGMASTER_FERNET_KEYS is not set" in result.stderr
    assert not (tmp_path / "fernet_key").exists()                     # a deployment's keys are its own
    fine = manage(tmp_path, "check", RINGMASTER_FERNET_KEYS="A" * 43 + "=", **deployed)
    assert fine.returncode == 0, fine.stderr
