"""Shared fixtures. Integration tests run real parts: PostgreSQL, Redis, a Celery worker,
uvicorn and horovodrun, as separate processes that see the test database."""
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
ELASTIC_SETTLE_SECONDS = 10


# The modules of the suite's longest tests (a minute or more each on a busy 2-core machine;
# `make test` lists the slowest), longest first.
LONGEST_FIRST = ("integration/test_torchrun_elastic.py", "integration/test_elastic_jobs.py",
                 "integration/test_torchrun.py", "integration/test_followers.py", "test_api_fuzz.py",
                 "integration/test_gpu_binding.py", "integration/test_instances.py")


def pytest_collection_modifyitems(config, items):
    """The longest tests first, then the other integration and browser tests (which start
    services and run jobs), then the fast ones. `make test` hands tests to its xdist workers one
    at a time as each finishes one (--maxschedchunk 1), so the long tests start early on every
    worker and the short ones fill the workers' last minutes."""
    def rank(item):
        path = item.path.relative_to(Path(__file__).parent).as_posix()
        if path in LONGEST_FIRST:
            return LONGEST_FIRST.index(path)
        slow = any(item.get_closest_marker(name) for name in ("integration", "browser"))
        return len(LONGEST_FIRST) + (0 if slow else 1)
    items.sort(key=rank)


def job_name(job_id):
    """The name the portal gives job `job_id` outside its database (folder, MPIJob): with this
    installation's id, read from the database the worker and the web server share."""
    from jobs.installation import installation_id

    return f"rm-{installation_id()}-{job_id}"


def wait_for(condition, timeout=60.0, interval=0.1, message="condition"):
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {message}")
        time.sleep(interval)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _database_url():
    from jobs.database import on_postgresql

    db = settings.DATABASES["default"]
    if not on_postgresql():
        pytest.skip("integration tests need PostgreSQL (DATABASE_URL)")
    user = db.get("USER") or "postgres"
    host, port = db.get("HOST") or "127.0.0.1", db.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{db['NAME']}"


class Service:
    """A child process (worker, web server) that a test can kill and start again."""

    def __init__(self, name, argv, env, log_path, pass_fds=()):
        self.name, self.argv, self.env, self.log_path, self.pass_fds = name, argv, env, log_path, pass_fds
        self.process = None

    def start(self):
        self.log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.argv, cwd=ROOT, env=self.env, stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True, pass_fds=self.pass_fds)
        return self

    def kill(self, sig=signal.SIGKILL):
        """Kill the service's own processes (not the detached jobs it started)."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            self.process.wait(timeout=30)

    def stop(self):
        """Ask the service to stop; kill it if it has not within 30 s (a busy machine)."""
        try:
            self.kill(signal.SIGTERM)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)

    def output(self):
        return Path(self.log_path).read_text(errors="replace")


def pytest_configure(config):
    # Test users' passwords are hashed in microseconds, not a second each (tests.passwords). Here,
    # not at import: bench/ imports this module's helpers without Django's settings.
    settings.PASSWORD_HASHERS = ["tests.passwords.OneIterationPBKDF2"]


@pytest.fixture(scope="session", autouse=True)
def _fernet_keys():
    """Secrets (instance SSH keys) are encrypted with a key made for this test session."""
    if not settings.RINGMASTER_FERNET_KEYS:
        from cryptography.fernet import Fernet

        settings.RINGMASTER_FERNET_KEYS = Fernet.generate_key().decode()


@pytest.fixture(scope="session")
def service_env(django_db_setup, django_db_blocker, tmp_path_factory, _fernet_keys, _local_nvidia_smi):
    """Environment for child processes: the test database, the test Redis, a jobs folder."""
    data_dir = tmp_path_factory.mktemp("ringmaster-data")
    env = dict(os.environ)
    env.update({
        "DATABASE_URL": _database_url(),
        "RINGMASTER_DATA_DIR": str(data_dir),
        "RINGMASTER_JOBS_DIR": str(settings.RINGMASTER_JOBS_DIR),
        "SECRET_KEY": settings.SECRET_KEY,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "PYTHONUNBUFFERED": "1",
        # This checkout's code, whichever checkout the venv's editable install points at.
        "PYTHONPATH": str(ROOT),
        "RINGMASTER_LOCAL_GPUS": "4",
        "RINGMASTER_FERNET_KEYS": settings.RINGMASTER_FERNET_KEYS,
        # The Kubernetes backend against the fake API server: poll pods often, give up on a call soon.
        "RINGMASTER_KUBE_POLL_SECONDS": "0.3",
        "RINGMASTER_KUBE_REQUEST_SECONDS": "3",
        # This machine's nvidia-smi is the fake of tests/fakegpu where a test puts it (fake_gpus),
        # and absent otherwise, even on a machine with GPUs; asked afresh each time.
        "RINGMASTER_NVIDIA_SMI": str(settings.RINGMASTER_NVIDIA_SMI),
        "RINGMASTER_GPU_CHECK_SECONDS": "0",
        "RINGMASTER_TELEMETRY_SECONDS": "0.5",
        # Elastic jobs: resized once their ranks are up (the test scripts start in a few seconds).
        "RINGMASTER_ELASTIC_SETTLE_SECONDS": str(ELASTIC_SETTLE_SECONDS),
        # A restarted job waits this long (a backoff short enough for a test to wait it out).
        "RINGMASTER_RESTART_BACKOFF_SECONDS": "1",
    })
    if not env.get("REDIS_URL"):
        pytest.skip("integration tests need Redis (REDIS_URL)")
    yield env
    # The services are stopped by now; end their database sessions so the test database can go.
    with django_db_blocker.unblock():
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")


@pytest.fixture(scope="session", autouse=True)
def _local_nvidia_smi(tmp_path_factory):
    """This machine's nvidia-smi, for the portal: absent until a test installs the fake there."""
    settings.RINGMASTER_NVIDIA_SMI = tmp_path_factory.mktemp("local-gpus") / "nvidia-smi"
    settings.RINGMASTER_GPU_CHECK_SECONDS = 0


FAKE_NVIDIA_SMI = Path(__file__).resolve().parent / "fakegpu" / "nvidia-smi"


def gpu_config(names, utilization=None, behaviour="ok"):
    """The fake nvidia-smi's configuration: GPUs called `names`, index by index."""
    import json

    return json.dumps({"behaviour": behaviour, "gpus": [
        {"name": name, "memory_total": 81920, "memory_used": 2048 + 1024 * i,
         "utilization": None if utilization is None else utilization[i], "power": 100.0 + 10 * i}
        for i, name in enumerate(names)]})


def install_fake_nvidia_smi(directory, names, **config):
    """A folder holding the fake nvidia-smi and its GPUs: put it on a PATH, or name its program."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    program = directory / "nvidia-smi"
    if not program.exists():
        program.symlink_to(FAKE_NVIDIA_SMI)
    (directory / "gpus.json").write_text(gpu_config(names, **config))
    return program


@pytest.fixture
def local_gpus(_local_nvidia_smi):
    """Give this machine fake GPUs: local_gpus(["NVIDIA A100-SXM4-80GB"] * 4, utilization=[...]).
    The portal (this process, the worker, uvicorn) sees them at its next look; gone after the test."""
    path = Path(settings.RINGMASTER_NVIDIA_SMI)

    def give(names, **config):
        return install_fake_nvidia_smi(path.parent, names, **config)
    yield give
    path.unlink(missing_ok=True)
    (path.parent / "gpus.json").unlink(missing_ok=True)


@pytest.fixture(scope="session", autouse=True)
def _jobs_dir(tmp_path_factory):
    """Job working directories of this test session live in a temporary folder."""
    settings.RINGMASTER_JOBS_DIR = tmp_path_factory.mktemp("jobs")


class Worker(Service):
    """A real Celery worker (thread pool) on `queue`, with the tests' app (tests.worker_app).

    Between tests it is drained: it takes no task and follows no job while the test database is
    reset. Django's flush truncates every table at once; a scheduler pass or a follower of the
    worker's that held a lock on one table and waited for another would deadlock with it. A
    drained worker holds and takes none, so the reset never meets it.
    """

    def __init__(self, name, env, log_path, queue=None, concurrency=8):
        self.queue = queue or env.get("RINGMASTER_QUEUE") or settings.CELERY_TASK_DEFAULT_QUEUE
        self.hostname = f"{name}-{os.getpid()}@{socket.gethostname()}"
        self.drained = False
        super().__init__(name, [str(VENV_BIN / "celery"), "-A", "tests.worker_app", "worker", "--pool", "threads",
                                "--concurrency", str(concurrency), "-n", self.hostname, "-Q", self.queue,
                                "--loglevel", "INFO", "--without-gossip", "--without-mingle"], env, log_path)

    def start(self):
        super().start()
        self.drained = False
        return self

    def alive(self):
        return self.process is not None and self.process.poll() is None

    def ready(self, timeout=60):
        """Wait until the worker answers (it consumes its queue from then on)."""
        from portal.celery import app

        wait_for(lambda: not self.alive() or app.control.ping(destination=[self.hostname], timeout=0.5),
                 timeout=timeout, interval=0, message=f"Celery worker {self.name} to be ready")
        if not self.alive():
            raise AssertionError(f"Celery worker {self.name} exited:\n{self.output()[-3000:]}")
        return self

    def busy(self):
        """What the worker runs, holds or follows now ({"tasks": [...], "follows": [...]})."""
        from portal.celery import app

        replies = app.control.broadcast("ringmaster_busy", destination=[self.hostname], reply=True, timeout=5)
        if not replies:
            raise AssertionError(f"Celery worker {self.name} did not answer")
        return replies[0][self.hostname]

    def drain(self, timeout=60):
        """Stop taking tasks, then wait until every task taken and every follow has ended."""
        if not self.alive():
            return
        from portal.celery import app

        self.ready()            # a worker started again mid-test hears its control messages only then
        if not app.control.cancel_consumer(self.queue, destination=[self.hostname], reply=True, timeout=5):
            raise AssertionError(f"Celery worker {self.name} did not stop taking tasks")
        self.drained = True
        self.idle(timeout)

    def idle(self, timeout=60):
        """Wait until the worker runs no task, holds none and follows no job."""
        busy = {}

        def idle():
            busy.update(self.busy())
            return not busy["tasks"] and not busy["follows"]
        try:
            wait_for(idle, timeout=timeout, interval=0.05, message=f"worker {self.name} to be idle")
        except AssertionError as error:
            raise AssertionError(f"{error}: still busy with {busy}") from None

    def resume(self):
        """Take tasks again, leaving out those sent while it was drained (to a database since reset)."""
        if not self.alive():
            self.start()
        if self.drained:
            from portal.celery import app

            with app.connection_for_write() as connection:
                connection.default_channel.queue_purge(self.queue)
            if not app.control.add_consumer(self.queue, destination=[self.hostname], reply=True, timeout=5):
                raise AssertionError(f"Celery worker {self.name} did not take tasks again")
            self.drained = False
        return self.ready()


# The session's worker and web server, by the fixture that hands them to tests: their logs tell why
# a test that used them failed.
SERVICES_OF_THE_SESSION = {}
SERVICE_LOG_LINES = 80


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used the session's worker or web server shows the end of their logs:
    a job that never started or a task that failed says why there, not in the assertion."""
    report = (yield).get_result()
    if report.failed and report.when == "call":
        for fixture, service in SERVICES_OF_THE_SESSION.items():
            if fixture in item.fixturenames:
                tail = "\n".join(service.output().splitlines()[-SERVICE_LOG_LINES:])
                report.sections.append((f"the session's {service.name} (its log's last lines)", tail))


@pytest.fixture(scope="session")
def _session_worker(service_env, tmp_path_factory):
    from portal.celery import app

    app.control.purge()
    worker = Worker("worker", service_env, tmp_path_factory.mktemp("logs") / "worker.log").start()
    worker.ready()
    SERVICES_OF_THE_SESSION["celery_worker"] = worker
    yield worker
    del SERVICES_OF_THE_SESSION["celery_worker"]
    worker.stop()


@pytest.fixture
def celery_worker(_session_worker):
    """The session's Celery worker, taking tasks during this test and drained after it (before
    the test database is reset: this fixture is torn down before the database's)."""
    yield _session_worker.resume()
    _session_worker.drain()


class WebServer(Service):
    """uvicorn serving the portal (ASGI) on a port of its own; a test may kill it and start it
    again on the same port."""

    def __init__(self, env, log_path):
        # The listening socket is this process's and uvicorn serves it (--fd): no other process
        # can take the port between choosing it and serving it, nor between two starts.
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(128)
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__("web", [str(VENV_BIN / "uvicorn"), "portal.asgi:application", "--fd",
                                 str(self.socket.fileno()), "--ws", "portal.websocket:WebSocketProtocol",
                                 "--timeout-graceful-shutdown", "10"], env, log_path,
                         pass_fds=(self.socket.fileno(),))

    def stop(self):
        super().stop()
        self.socket.close()

    def up(self):
        try:
            return requests.get(f"{self.url}/login/", timeout=2).status_code == 200
        except (requests.ConnectionError, requests.Timeout):
            # The socket listens while uvicorn is still importing Django: a request waits in the
            # backlog and can time out before it is served, which is "not up yet", not a failure.
            return False

    def start(self):
        super().start()
        wait_for(self.up, timeout=90, message="uvicorn to serve the portal")
        return self


@pytest.fixture(scope="session")
def live_portal(service_env, tmp_path_factory):
    """The portal served by uvicorn for the whole session; yields its base URL."""
    server = WebServer(service_env, tmp_path_factory.mktemp("logs") / "web.log").start()
    SERVICES_OF_THE_SESSION["live_portal"] = server
    yield server.url
    del SERVICES_OF_THE_SESSION["live_portal"]
    server.stop()


@pytest.fixture
def restartable_portal(service_env, tmp_path):
    """A web server of this test's own, which the test may kill and start again."""
    server = WebServer(service_env, tmp_path / "web.log").start()
    yield server
    server.stop()


@pytest.fixture
def http(live_portal, celery_worker, image, make_user):
    """A requests session of user alice, authenticated with an API token, against uvicorn."""
    from jobs.domain import tokens

    user = make_user("alice")
    session = requests.Session()
    session.headers["Authorization"] = f"Token {tokens.issue(user).key}"
    session.base = live_portal
    return session


def needs_row_locks():
    """Race tests need PostgreSQL's row locks; on SQLite (which serialises every write) they
    would prove nothing. `make test` runs them on PostgreSQL (its DATABASE_URL)."""
    from jobs.database import on_postgresql, vendor

    if not on_postgresql():
        if re.match(r"postgres(ql)?://", os.environ.get("DATABASE_URL", "")):
            pytest.fail(f"DATABASE_URL names PostgreSQL but the test database is {vendor()}: "
                        "the race tests would not run")
        pytest.skip("race test skipped: it needs PostgreSQL's row locks (SQLite serialises writes, so a "
                    "race there proves nothing); `make test` runs it on PostgreSQL")


@pytest.fixture
def row_locks():
    """A race test's fixture: skips (saying why) where needs_row_locks() does, and the skip is
    reported against the test itself."""
    needs_row_locks()


def admit_from_threads(count=8, join_timeout=60):
    """Run jobs.domain.scheduler.admit() from `count` threads released at once: (admitted ids, errors)."""
    import threading

    from django.db import connection

    from jobs.domain import scheduler

    admitted, errors, barrier = [], [], threading.Barrier(count)

    def admit():
        try:
            barrier.wait()
            admitted.extend(scheduler.admit())
        except Exception as exc:  # pragma: no cover - reported to the caller
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=admit) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=join_timeout)
    return admitted, errors


def run_to_end(runner, spec, statuses=None):
    """Launch a job with a runner and follow it to its end: (lines, the Exited event); the
    reasons of its Status events are appended to `statuses` where given."""
    from runners.base import Exited, Output, Status, waited
    from runners.output import OutputSplitter

    runner.launch(spec)
    splitter, lines, exited = OutputSplitter(), [], None
    for event in waited(runner.follow(spec, 0)):
        if isinstance(event, Output):
            lines.extend(splitter.feed(event.data))
        elif isinstance(event, Status) and statuses is not None:
            statuses.append(event.reason)
        elif isinstance(event, Exited):
            exited = event
            break
    return lines + splitter.finish(), exited


@pytest.fixture
def image(db):
    from jobs.models import Image

    return Image.objects.create(name="horovod-cpu", python=sys.executable, description="test image")


@pytest.fixture
def make_user(db, django_user_model):
    def make(username="alice", **extra):
        return django_user_model.objects.create_user(username=username, password="pw-" + username, **extra)
    return make


@pytest.fixture
def alice(make_user):
    return make_user("alice")


@pytest.fixture
def script(alice):
    """An uploaded script of alice's (a module may define its own)."""
    from jobs.models import Script

    return Script.objects.create(owner=alice, name="train.py", sha256="0" * 64, size=10, content="print(1)\n")


@pytest.fixture
def api_client(make_user):
    """An API client for a fresh user with a token: client(user) -> requests.Session-like."""
    from jobs.domain import tokens
    from rest_framework.test import APIClient

    def client_for(user):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {tokens.issue(user).key}")
        return client
    return client_for


def job_processes(job_id):
    """Live processes that carry the marker of this test session's job `job_id`."""
    from runners.base import JOB_DIR_VAR

    return processes_marked(str((Path(settings.RINGMASTER_JOBS_DIR) / job_name(job_id)).resolve()), JOB_DIR_VAR)


def processes_marked(marker, variable):
    """Live processes whose environment has `variable` set to `marker` (a job's folder)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.status() != psutil.STATUS_ZOMBIE and process.environ().get(variable) == marker:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            # A process started during this test session that cannot be read may be a job's: a
            # failure to look, not proof that the job is gone. Older ones cannot be a job's.
            if _started_during_the_session(process):
                raise
    return found


SESSION_STARTED = time.time()


def _started_during_the_session(process):
    try:
        return process.create_time() >= SESSION_STARTED
    except psutil.Error:
        return False
