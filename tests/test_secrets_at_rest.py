"""Secrets at rest (issue 58, F): the embedded portal's data folder is 0700 and its SQLite files
0600, so another local account reads neither the database (sessions, password hashes) nor a
token; a token is kept as its SHA-256 only, and tokens stored in plain text before are migrated
to digests that keep working; the admin's first password reaches a 0600 file and the terminal,
never an output that may be a log.

The data folder is made as `make run` makes it: by fresh processes (migrate, seed_demo,
create_api_token) with nothing but RINGMASTER_DATA_DIR set."""
import importlib
import os
import pty
import select
import sqlite3
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.apps import apps
from django.db import connection
from rest_framework.test import APIClient

from jobs.models import ApiToken
from tests.conftest import ROOT

NOBODY = 65534
MAKE = """
import django, sys
django.setup()
from django.contrib.auth import get_user_model
from django.core.management import call_command
call_command("migrate", verbosity=0)
call_command("seed_demo")
get_user_model().objects.create_user("alice")
call_command("create_api_token", "alice")
"""


def embedded(data_dir, *argv, code=None, **kwargs):
    env = {"PATH": os.environ["PATH"], "HOME": str(data_dir), "RINGMASTER_DATA_DIR": str(data_dir),
           "DJANGO_SETTINGS_MODULE": "portal.settings", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-c", code] if code else [sys.executable, str(ROOT / "manage.py"), *argv]
    return subprocess.run(command, cwd=ROOT, env=env, timeout=300, **kwargs)


@pytest.fixture(scope="module")
def portal_data(tmp_path_factory):
    """(data folder, seed_demo's and create_api_token's output) of a fresh embedded portal (with
    no terminal: tests/integration/test_ready_banner.py shows what the banner says then)."""
    data_dir = tmp_path_factory.mktemp("secrets") / "var"
    # As an older installation left them: a folder others may enter, a database file they may read.
    data_dir.mkdir()
    data_dir.chmod(0o755)
    (data_dir / "ringmaster.sqlite3").touch(mode=0o644)
    made = embedded(data_dir, code=MAKE, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    return data_dir, made.stdout


def as_nobody(code):
    """Run `code` (Python) as another local account; its output."""
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60).stdout


def test_another_account_reads_neither_the_database_nor_a_token(portal_data):
    data_dir, output = portal_data
    key = output.split()[-1]
    database = data_dir / "ringmaster.sqlite3"
    # A reader holds the database open in WAL mode, as the portal's processes do: -wal and -shm appear.
    reader = sqlite3.connect(database)
    try:
        reader.execute("PRAGMA journal_mode=WAL")
        reader.execute("SELECT count(*) FROM jobs_apitoken").fetchone()
        files = [database, data_dir / "ringmaster.sqlite3-wal", data_dir / "ringmaster.sqlite3-shm"]
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
        assert {file.name: stat.S_IMODE(file.stat().st_mode) for file in files} == {file.name: 0o600 for file in files}
        tried = as_nobody(
            "import os, sys\n"
            f"for path in {[str(data_dir)] + [str(file) for file in files]!r}:\n"
            "    try:\n"
            "        (os.listdir if os.path.isdir(path) else lambda p: open(p, 'rb').read(1))(path); print('read', path)\n"
            "    except PermissionError:\n"
            "        print('refused', path)\n")
        assert tried.split() == [word for path in [data_dir, *files] for word in ("refused", str(path))]
    finally:
        reader.close()
    stored = b"".join(path.read_bytes() for path in data_dir.glob("ringmaster.sqlite3*"))
    assert len(key) == 40 and key.encode() not in stored                # only its digest is kept
    assert ApiToken._meta.db_table.encode() in stored


def test_the_admins_password_goes_to_a_private_file_and_the_terminal_only(portal_data):
    data_dir, output = portal_data
    kept = data_dir / "initial_admin_password"
    password = kept.read_text().split()[1]
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert password not in output and str(kept) in output                # seed_demo says where, not what

    class Login(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Login)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (data_dir / "run").mkdir(exist_ok=True)
    for name in ("worker", "beat"):
        (data_dir / "run" / f"{name}.ready").write_text("1\n")
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        # Under honcho, as in `make run`: stdout and stderr are pipes (a log, maybe), stdin the terminal.
        terminal, screen = pty.openpty()
        banner = embedded(data_dir, "ready_banner", "--url", url, "--exit", "--timeout", "30",
                          stdin=screen, capture_output=True, text=True)
        os.close(screen)
        seen = b""
        while select.select([terminal], [], [], 0.5)[0]:
            try:
                seen += os.read(terminal, 4096)
            except OSError:
                break
        os.close(terminal)
        assert banner.returncode == 0, banner.stderr
        assert f"Log in as admin with password {password}" in seen.decode()
        assert password not in banner.stdout + banner.stderr and "is on the terminal" in banner.stdout
    finally:
        server.shutdown()


@pytest.mark.django_db
def test_tokens_stored_in_plain_text_are_migrated_to_digests_and_keep_working(alice):
    """What DRF's authtoken table held (that app is no longer installed)."""
    migration = importlib.import_module("jobs.migrations.0024_api_token_digest")
    key = "0123456789abcdef0123456789abcdef01234567"
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created timestamp with time zone "
                       "NOT NULL, user_id integer NOT NULL)")
        cursor.execute("INSERT INTO authtoken_token VALUES (%s, now(), %s)", [key, alice.pk])
    with connection.schema_editor() as editor:
        migration.hash_plain_tokens(apps, editor)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM authtoken_token")
        assert cursor.fetchone() == (0,)
    assert key not in ApiToken.objects.get(user=alice).digest
    client = APIClient(REMOTE_ADDR="198.51.100.9")
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/quota/").status_code == 200
