"""A backend that lives only in the tests: the proof that jobs/backends/ is the whole seam.

Enable it by adding "tests.fakebackend.FakeBackend" to settings.RINGMASTER_BACKENDS (the
environment variable of the same name, for a worker or a web server). Nothing else in the portal
is told about it.

FakeRunner runs nothing: launch() writes, once, what horovodrun would have printed (Gloo-tagged
lines of two ranks and a metric) to <root>/rm-job-<id>/output.log, and the exit code. A job whose
env sets HOLD_ENV keeps running (no exit code) until it is cancelled, so a test can fill the
backend's capacity or a quota with it.
"""
import os
import time
from pathlib import Path

from django.conf import settings

from jobs.backends.base import Backend
from runners.base import Exited, Output, Runner, Started, Waiting

ROOT_ENV = "RINGMASTER_FAKE_JOBS_DIR"    # where its job folders go (default: <jobs dir>/fake)
HOLD_ENV = "FAKE_HOLD"                   # in a job's env: run until cancelled
SLOW_CANCEL_ENV = "FAKE_CANCEL_SECONDS"  # in a job's env: a cancel takes this long (processes slow to go)
CANCELLED_CODE = 143                     # what a launcher ended by SIGTERM reports
OUTPUT = (b"[0]<stdout>:hello from rank 0\n"
          b"[1]<stdout>:hello from rank 1\n"
          b'[0]<stdout>:RINGMASTER_METRIC {"step": 1, "loss": 0.5}\n')


class FakeRunner(Runner):
    name = "fake"

    def __init__(self, root, poll_interval=0.05):
        self.root, self.poll_interval = Path(root), poll_interval

    def job_dir(self, spec):
        return self.root / spec.name

    def launch(self, spec):
        directory = self.job_dir(spec)
        directory.mkdir(parents=True, exist_ok=True)
        try:        # the marker is created once, atomically: a second launch finds it
            os.close(os.open(directory / "started", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return Started("the fake job already started", already_running=True)
        (directory / "output.log").write_bytes(OUTPUT)
        if not spec.env.get(HOLD_ENV):
            _write_exit_code(directory, 0)
        return Started(f"the fake job started with {spec.gpus} ranks")

    def follow(self, spec, offset, cursor=None):
        directory = self.job_dir(spec)
        if not (directory / "started").exists():
            yield Exited(None, "the fake job was never started")
            return
        with open(directory / "output.log", "rb") as log:
            log.seek(offset)
            while True:
                code = _exit_code(directory)       # read before the output: it is written after
                data = log.read()
                if data:
                    yield Output(data, offset)
                    offset += len(data)
                elif code is not None:
                    yield Exited(code, f"the fake job exited with code {code}")
                    return
                else:
                    yield Waiting(seconds=self.poll_interval)

    def cancel(self, spec):
        directory = self.job_dir(spec)
        if spec.env.get(SLOW_CANCEL_ENV):             # "cancelling" is there while it waits
            (directory / "cancelling").touch()
            time.sleep(float(spec.env[SLOW_CANCEL_ENV]))
            (directory / "cancelling").unlink(missing_ok=True)
        if (directory / "started").exists() and _exit_code(directory) is None:
            (directory / "cancelled").touch()
            _write_exit_code(directory, CANCELLED_CODE)


def _exit_code(directory):
    try:
        return int((directory / "exit_code").read_text())
    except FileNotFoundError:
        return None


def _write_exit_code(directory, code):
    (directory / "exit_code.tmp").write_text(str(code))
    (directory / "exit_code.tmp").rename(directory / "exit_code")


def fake_root():
    return Path(os.environ.get(ROOT_ENV) or Path(settings.RINGMASTER_JOBS_DIR) / "fake")


class FakeBackend(Backend):
    name = "fake"
    label = "Fake (tests)"
    launchers = ("horovod",)        # a backend that starts one kind of job (its runner writes what a rank would)

    def capacity(self):
        return 3

    def largest_job(self):
        return 3

    def runner(self, job):
        return FakeRunner(fake_root())

    def links(self, job):
        return [("Fake details", f"/jobs/{job.pk}/", "fake-link")]
