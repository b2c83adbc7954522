"""`make run`'s last word: once the web server answers and the worker and beat are ready, one
short banner (the URL, the admin's first password while it is unchanged, the first step), after
a hundred lines of start-up output. The password is written to the terminal only; honcho's
output, which may be kept in a log, says which file holds it. Then it waits, since honcho stops
every process when one ends."""
import os
import signal
import time
import urllib.error
import urllib.request

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from portal.readiness import marker

PASSWORD_FILE = "initial_admin_password"


def keep_initial_password(username, password):
    """Keep the admin's generated first password (0600, in the data folder) for the banner; its path."""
    path = settings.DATA_DIR / PASSWORD_FILE
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{username}\n{password}\n")
    return path


def login_line(reveal):
    """How to log in: the first password while it still works (`reveal`: itself, else the file
    that holds it), else how to set one."""
    path = settings.DATA_DIR / PASSWORD_FILE
    try:
        username, password = path.read_text().split()[:2]
    except (OSError, ValueError):
        return "Log in as your admin user (forgot it? .venv/bin/python manage.py changepassword admin)."
    user = get_user_model().objects.filter(username=username).first()
    if user is None or not user.check_password(password):
        path.unlink(missing_ok=True)                # changed: the file has no more use
        return f"Log in as {username} (password changed; reset it: .venv/bin/python manage.py changepassword {username})."
    if reveal:
        return f"Log in as {username} with password {password}"
    return f"Log in as {username} with the password in {path} (readable by this account only)"


def terminal():
    """The terminal the portal was started from, or None. Under honcho stdout and stderr are
    pipes (to honcho, whose output may go to a log file) and stdin is still the terminal."""
    for fd in (1, 2, 0):
        try:
            if os.isatty(fd):
                return os.ttyname(fd)
        except OSError:
            continue
    return None


def web_answers(url):
    try:
        with urllib.request.urlopen(url + "login/", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


class Command(BaseCommand):
    help = "Wait for the web server, worker and beat of `make run`, then print where and how to log in."

    def add_arguments(self, parser):
        parser.add_argument("--url", required=True, help="the portal's address, e.g. http://127.0.0.1:8000/")
        parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for everything to be up")
        parser.add_argument("--exit", action="store_true", help="exit after the banner instead of waiting")

    def handle(self, url, timeout, exit, **options):
        url = url if url.endswith("/") else url + "/"
        deadline = time.monotonic() + timeout
        waiting_for = ["web"]
        while time.monotonic() < deadline:
            waiting_for = [name for name, up in (
                ("web", web_answers(url)),
                ("worker", marker("worker").exists()), ("beat", marker("beat").exists())) if not up]
            if not waiting_for:
                break
            time.sleep(0.5)
        else:
            raise CommandError(f"not up after {timeout:.0f} s: {', '.join(waiting_for)} (see the lines above)")
        rule = "=" * 72

        def banner(reveal):
            return "\n".join(["", rule, f"  Ringmaster is ready at {url}", f"  {login_line(reveal)}",
                              "  First step: New job, pick hello_allreduce.py, 2 GPUs, Submit.",
                              "  Ctrl-C stops it.", rule, ""])
        # The password goes to the terminal only, never to an output that may be a log.
        tty = terminal()
        if tty is not None and not os.isatty(1):
            with open(tty, "w") as screen:
                screen.write(banner(reveal=True) + "\n")
            self.stdout.write(f"Ringmaster is ready at {url} (the banner, with how to log in, is on the terminal)")
        else:
            self.stdout.write(banner(reveal=tty is not None))
        self.stdout.flush()
        if not exit:
            try:
                signal.pause()
            except KeyboardInterrupt:       # Ctrl-C: honcho stops everything
                pass
