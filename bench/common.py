"""What the benchmarks share: their own database and Redis database, the portal's services as
real processes (uvicorn, a Celery worker), synthetic horovodrun output, websocket viewers.

The database and Redis database come from BENCH_DATABASE_URL and BENCH_REDIS_URL, never from
DATABASE_URL/REDIS_URL: a benchmark empties the job tables of its database first, so it refuses
a database whose name does not contain "bench".

Also a command line for the helper processes the benchmarks start:

    python bench/common.py viewers ...   websocket viewers of one job (they report as JSON)
    python bench/common.py write ...     synthetic horovodrun output at a steady rate
"""
from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.conftest import VENV_BIN, Service, free_port, wait_for  # noqa: E402

BENCH_DATABASE_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/ringmaster_bench")
BENCH_REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
PYTHON = sys.executable
DATA_DIR: Path | None = None


# ------------------------------------------------------------------------------------------
# Environment: database, Redis, Django
# ------------------------------------------------------------------------------------------

def _create_database(url):
    import psycopg2

    parts = urlparse(url)
    name = parts.path.lstrip("/")
    conn = psycopg2.connect(host=parts.hostname or "127.0.0.1", port=parts.port or 5432,
                            user=parts.username or "postgres", password=parts.password, dbname="postgres")
    conn.autocommit = True
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
            if cursor.fetchone() is None:
                cursor.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()


def setup(reset=True, embedded=False):
    """Point Django at the bench database (created and migrated if needed) and a fresh data
    folder; empty the job tables and the bench Redis database. `embedded`: neither, as `make run`
    with nothing set (SQLite and the filesystem broker in the fresh data folder)."""
    global DATA_DIR
    name = urlparse(BENCH_DATABASE_URL).path.lstrip("/")
    if "bench" not in name and not embedded:
        raise SystemExit(f"refusing to use database {name!r}: a benchmark empties it (name it *bench*)")
    DATA_DIR = Path(tempfile.mkdtemp(prefix="ringmaster-bench-"))
    if os.environ.get("BENCH_KEEP"):
        print(f"keeping the bench's data and service logs in {DATA_DIR}")
    else:
        atexit.register(shutil.rmtree, DATA_DIR, True)
    (DATA_DIR / "logs").mkdir()
    os.environ.update({} if embedded else {"DATABASE_URL": BENCH_DATABASE_URL, "REDIS_URL": BENCH_REDIS_URL})
    if embedded:
        for setting in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"):
            os.environ.pop(setting, None)
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "RINGMASTER_DATA_DIR": str(DATA_DIR),
        "RINGMASTER_JOBS_DIR": str(DATA_DIR / "jobs"),
        "SECRET_KEY": "ringmaster-bench-not-a-secret",
        "LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
        "RINGMASTER_LOCAL_GPUS": "8",
        "PYTHONUNBUFFERED": "1",
    })
    if not os.environ.get("RINGMASTER_FERNET_KEYS"):    # secrets (a bench cluster's kubeconfig)
        from cryptography.fernet import Fernet

        os.environ["RINGMASTER_FERNET_KEYS"] = Fernet.generate_key().decode()
    if not embedded:
        _create_database(BENCH_DATABASE_URL)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    if reset and not embedded:
        reset_data()
    # A benchmark that follows jobs in this process plays the worker, which freezes its start-up
    # heap once it is ready (portal.celery).
    from portal.heap import freeze_startup_heap

    freeze_startup_heap()


def reset_data():
    import redis
    from django.db import connection

    from jobs.models import Job, Script

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {Job._meta.db_table}, {Script._meta.db_table} CASCADE")
    redis.Redis.from_url(BENCH_REDIS_URL).flushdb()


def bench_user():
    """(user, API token key) of the benchmarks' user."""
    from django.contrib.auth import get_user_model

    from jobs.domain import tokens

    user, _ = get_user_model().objects.get_or_create(username="bench")
    return user, tokens.issue(user).key


def bench_image(launchers="horovod"):
    from jobs.models import Image

    image = Image.objects.get_or_create(name="horovod-cpu", defaults={"python": PYTHON})[0]
    if image.launchers != launchers:
        Image.objects.filter(pk=image.pk).update(launchers=launchers)
    return image


def running_job(user, gpus=8, name="bench"):
    """A job in RUNNING state, as if launched: what a follower re-attaches to."""
    from jobs.domain import states
    from jobs.models import Job, State

    job = Job.objects.create(owner=user, image=bench_image(), gpus=gpus, script_path="bench.py",
                             time_limit_minutes=60, name=name)
    states.transition(job.pk, State.LAUNCHING)
    states.transition(job.pk, State.RUNNING)
    return job


def job_name(job_id):
    """The name the backends give job `job_id` outside the database (folder, MPIJob)."""
    from jobs import backends
    from jobs.models import Job

    return backends.job_spec(Job.objects.get(pk=job_id)).name


def api_session(url, token):
    """A requests session for the REST API at `url` with `token` (its URL in .base)."""
    import requests

    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"
    session.base = url
    return session


def jobs_root():
    return Path(os.environ["RINGMASTER_JOBS_DIR"])


def job_dir(job_id):
    return jobs_root() / job_name(job_id)


# ------------------------------------------------------------------------------------------
# Services (real processes) and cleanup
# ------------------------------------------------------------------------------------------

class Services:
    """uvicorn and Celery workers started for one benchmark; close() stops every one of them and
    every job process left in the bench's jobs folder."""

    def __init__(self):
        self.started = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _env(self, extra=None):
        env = dict(os.environ)
        env.update(extra or {})
        return env

    def web(self, extra_env=None, extra_args=()):
        import requests

        port = free_port()
        server = Service("web", [str(VENV_BIN / "uvicorn"), "portal.asgi:application", "--host", "127.0.0.1",
                                 "--port", str(port), "--ws", "portal.websocket:WebSocketProtocol",
                                 "--log-level", "warning", *extra_args],
                         self._env(extra_env), DATA_DIR / "logs" / f"web-{port}.log")
        self.started.append(server.start())
        url = f"http://127.0.0.1:{port}"

        def up():
            if server.process.poll() is not None:
                raise RuntimeError(f"uvicorn exited:\n{server.output()[-3000:]}")
            try:
                return requests.get(f"{url}/login/", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        wait_for(up, timeout=60, message="uvicorn to serve the portal")
        return url

    def worker(self, concurrency=4, extra_env=None):
        name = f"bench-{os.getpid()}-{len(self.started)}"
        worker = Service("worker", [str(VENV_BIN / "celery"), "-A", "portal", "worker", "--pool", "threads",
                                    "--concurrency", str(concurrency), "--loglevel", "INFO", "-n", f"{name}@%h",
                                    "--without-gossip", "--without-mingle"],
                         self._env(extra_env), DATA_DIR / "logs" / f"{name}.log")
        self.started.append(worker.start())
        wait_for(lambda: "ready." in worker.output(), timeout=90, message="the Celery worker to be ready")
        return worker

    def close(self):
        for service in reversed(self.started):
            stop(service)
        self.started.clear()
        kill_job_processes()


def cpu_seconds(service):
    """CPU time (user + system) used so far by a service's own process, not its children."""
    import psutil

    times = psutil.Process(service.process.pid).cpu_times()
    return times.user + times.system


def stop(service):
    try:
        service.stop()
    except subprocess.TimeoutExpired:
        service.kill()


def kill_job_processes():
    """Kill every process running in a job folder of this benchmark (never other jobs' ones)."""
    import psutil

    if DATA_DIR is None:
        return
    jobs = str(DATA_DIR / "jobs")
    for _ in range(3):
        found = []
        for process in psutil.process_iter():
            try:
                if process.pid != os.getpid() and process.cwd().startswith(jobs):
                    found.append(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if not found:
            return
        for process in found:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        psutil.wait_procs(found, timeout=5)


# ------------------------------------------------------------------------------------------
# Synthetic output: what a training job's ranks print, tagged as horovodrun --gloo tags it
# ------------------------------------------------------------------------------------------

_WARNING = ("/usr/local/lib/python3.11/site-packages/torch/nn/modules/conv.py:456: UserWarning: Plan failed "
            "with a cudnnException: CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: cudnnFinalize Descriptor "
            "Failed cudnn_status: CUDNN_STATUS_NOT_SUPPORTED (Triggered internally at conv_v8.cpp:919.)")


def synthetic_text(rank, i, rng):
    """(stream, text) of line `i` of `rank`: mostly progress lines of 60-120 characters, metric
    lines (about 1 in 12), warnings on stderr, log lines, a few blank and a few long lines."""
    step = i * 10
    loss = 2.5 * 0.999 ** i + rng.random() * 0.05
    roll = rng.random()
    if roll < 0.55:
        return "stdout", (f"Epoch {i // 500 + 1} [{(i % 500) * 256:>6}/128000 ({(i % 500) / 5:.0f}%)] "
                          f"loss={loss:.4f} acc={min(0.99, i / 5000):.3f} lr={0.1 * 0.98 ** (i // 500):.6f} "
                          f"batch_time={0.2 + rng.random() / 10:.3f}s data_time={rng.random() / 50:.3f}s")
    if roll < 0.63:
        return "stdout", (f'RINGMASTER_METRIC {{"step": {step}, "loss": {loss:.5f}, '
                          f'"img_per_sec": {800 + rng.random() * 50:.1f}, "lr": {0.1 * 0.98 ** (i // 500):.6f}}}')
    if roll < 0.65:
        return "stdout", f"Iter #{i}: {400 + rng.random() * 30:.1f} img/sec per GPU"
    if roll < 0.75:
        return "stderr", _WARNING
    if roll < 0.95:
        return "stdout", (f"[2026-11-23 10:{i // 60 % 60:02d}:{i % 60:02d},{rng.randrange(1000):03d}] INFO "
                          f"trainer.py:{rng.randrange(100, 900)} rank {rank}: checkpoint shard {i % 97} "
                          f"written to /data/ckpt/run-{rank}/shard-{i % 97}.pt ({rng.random() * 900:.1f} MB)")
    if roll < 0.99:
        return "stdout", ""
    config = {f"layer{k}.{name}": [64 * (k + 1), rng.randrange(3, 8)] for k in range(20)
              for name in ("weight", "bias")}
    return "stdout", "config: " + json.dumps(config)


def synthetic_lines(ranks, lines_per_rank, seed=0):
    """[(rank, stream, text)] in an order horovodrun could write them: round by round, the
    ranks in a random order each round."""
    rng = random.Random(seed)
    out = []
    for i in range(lines_per_rank):
        order = list(range(ranks))
        rng.shuffle(order)
        for rank in order:
            stream, text = synthetic_text(rank, i, rng)
            out.append((rank, stream, text))
    return out


def gloo_bytes(lines):
    """horovodrun --gloo's combined output for (rank, stream, text) lines."""
    return "".join(f"[{rank}]<{stream}>:{text}\n" for rank, stream, text in lines).encode()


def stamp_of(text):
    """The time.time() a stamped line ("@<time> ...") was printed, or None."""
    if text.startswith("@"):
        with contextlib.suppress(ValueError):
            return float(text[1:text.index(" ")])
    return None


def write_paced(path, rate, seconds, ranks, seed=0):
    """Append stamped synthetic lines to `path` at `rate` lines/s for `seconds`, every 5 ms
    what is due, then write `exit_code` next to it as the local runner's wrapper does."""
    rng = random.Random(seed)
    total = int(rate * seconds)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    start = time.time()
    written = 0
    try:
        while written < total:
            due = min(total, int((time.time() - start) * rate) + 1)
            chunk = []
            while written < due:
                rank = written % ranks
                stream, text = synthetic_text(rank, written // ranks, rng)
                chunk.append(f"[{rank}]<{stream}>:@{time.time():.6f} n={written} {text}\n")
                written += 1
            if chunk:
                os.write(fd, "".join(chunk).encode())
            time.sleep(0.005)
    finally:
        os.close(fd)
    directory = Path(path).parent
    (directory / "exit_code.tmp").write_text("0\n")
    (directory / "exit_code.tmp").rename(directory / "exit_code")
    return total


def start_paced_writer(job_id, rate, seconds, ranks, seed=0):
    """A process that 'is' horovodrun for the local runner: writes output.log at a steady rate,
    recorded in the job's pid file so the runner sees it alive until it writes exit_code."""
    from runners.local import start_ticks

    directory = job_dir(job_id)
    directory.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen([PYTHON, str(Path(__file__)), "write", "--out", str(directory / "output.log"),
                                "--rate", str(rate), "--seconds", str(seconds), "--ranks", str(ranks),
                                "--seed", str(seed)], cwd=directory, start_new_session=True)
    (directory / "pid.tmp").write_text(f"{process.pid} {start_ticks(process.pid)}\n")
    (directory / "pid.tmp").rename(directory / "pid")
    return process


def follow_in_thread(job_id):
    """Run the real follower (jobs.domain.follow.run) of a job in a thread; returns the thread, whose
    .done_at is the time.time() it returned."""
    def target():
        from django.db import connection

        from jobs.domain import follow

        try:
            follow.run(job_id)
        finally:
            thread.done_at = time.time()
            connection.close()

    thread = threading.Thread(target=target, name=f"follow-{job_id}", daemon=True)
    thread.done_at = None
    thread.start()
    return thread


# ------------------------------------------------------------------------------------------
# Websocket viewers (run in helper processes, so their work does not slow the benchmark's own)
# ------------------------------------------------------------------------------------------

def percentile(values, q):
    """Nearest-rank percentile of `values` (q in 0..100); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def summary(values):
    return {"n": len(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "max": max(values) if values else None,
            "mean": statistics.fmean(values) if values else None}


_LINES_HEAD, _METRICS_HEAD = '{"type": "lines", ', '{"type": "metrics", '
# Keys, not values: JSON escapes a quote inside a line's text, so `{"seq": ` and `"text": "` begin
# only a line and its text.
_SEQ_KEY, _STAMPED_KEY = '{"seq": ', '"text": "@'


def _number_at(raw, start, end_char):
    return raw[start:raw.index(end_char, start)]


def _frame_of_lines(raw):
    """(first seq, last seq, lines, stamped lines, the first stamped line's stamp or None) of a
    lines frame, read with C-speed scans and no Python work per line: 200 viewers share the two
    cores with the portal they measure (a regex pass per frame and a float per line would take
    40% of the viewers' CPU, a core of the two)."""
    count = raw.count(_SEQ_KEY)
    if not count:
        return None
    first = int(_number_at(raw, raw.index(_SEQ_KEY) + len(_SEQ_KEY), ","))
    last = int(_number_at(raw, raw.rindex(_SEQ_KEY) + len(_SEQ_KEY), ","))
    stamped = raw.count(_STAMPED_KEY)
    stamp = None
    if stamped:
        with contextlib.suppress(ValueError):
            stamp = float(_number_at(raw, raw.index(_STAMPED_KEY) + len(_STAMPED_KEY), " "))
    return first, last, count, stamped, stamp


async def _one_viewer(url, headers, until_seq, until_stamped, deadline, ready, keep):
    from websockets.asyncio.client import connect

    stats = {"lines": 0, "frames": 0, "dups": 0, "missing": 0, "last_seq": -1, "first_recv": None, "last_recv": None,
             "stamped": 0, "complete": False, "error": None}
    lags, kept = [], []
    try:
        async with connect(url, additional_headers=headers, max_size=None, open_timeout=60,
                           ping_interval=None) as ws:
            first = json.loads(await ws.recv())
            assert first["type"] == "state", first
            ready()
            expected = 0
            while True:
                remaining = deadline - time.time()
                if remaining <= 0:
                    break
                try:
                    raw = await asyncio.wait_for(ws.recv(), remaining)
                except TimeoutError:
                    break
                now = time.time()
                if raw.startswith(_METRICS_HEAD):
                    continue
                frame = _frame_of_lines(raw) if raw.startswith(_LINES_HEAD) and not keep else None
                if frame and frame[0] == expected and frame[1] == expected + frame[2] - 1:
                    # From where this viewer is, as many lines as its seqs span: taken as in
                    # order, once (the portal's frames are runs of stored seqs; a frame that spans
                    # another count goes to the loop below, which reads each line; a missing and a
                    # repeated line inside one frame would cancel out here: the suite's replay
                    # tests check every line). Each stamped line's lag is counted as the frame's
                    # oldest line's, its first: an upper bound of the lines' lags.
                    first, last, count, stamped, stamp = frame
                    lines = ()
                    expected += count
                    stats["lines"] += count
                    stats["stamped"] += stamped
                    if stamp is not None:
                        lags.extend([now - stamp] * stamped)
                else:
                    message = json.loads(raw)
                    if message["type"] != "lines":
                        continue
                    lines = message["lines"]
                stats["frames"] += 1
                if stats["first_recv"] is None:
                    stats["first_recv"] = now
                stats["last_recv"] = now
                for line in lines:
                    seq = line["seq"]
                    if seq < expected:
                        stats["dups"] += 1
                        continue
                    stats["missing"] += seq - expected
                    expected = seq + 1
                    stats["lines"] += 1
                    stamp = stamp_of(line["text"])
                    if stamp is not None:
                        stats["stamped"] += 1
                        lags.append(now - stamp)
                        if keep:
                            kept.append([line["text"].split(" ", 2)[1], now])
                stats["last_seq"] = expected - 1
                if (until_seq is not None and stats["last_seq"] >= until_seq) or (
                        until_stamped is not None and stats["stamped"] >= until_stamped):
                    stats["complete"] = True
                    break
    except Exception as exc:  # reported, not raised: one viewer's failure is a figure too
        stats["error"] = f"{type(exc).__name__}: {exc}"
    stats["lag"] = summary(lags)
    if keep:
        stats["kept"] = kept
    return stats


async def _viewers_main(args):
    headers = {"Authorization": f"Token {args.token}"}
    url = f"{args.url}/ws/jobs/{args.job}/?since=-1"
    deadline = time.time() + args.timeout
    pending = {"n": args.count}

    def ready():
        pending["n"] -= 1
        if pending["n"] == 0:
            print("ready", flush=True)

    tasks = []
    for _ in range(args.count):
        tasks.append(asyncio.ensure_future(_one_viewer(url, headers, args.until_seq, args.until_stamped,
                                                       deadline, ready, args.keep)))
        await asyncio.sleep(0.005)            # do not hit the server with every handshake at once
    results = await asyncio.gather(*tasks)
    Path(args.out).write_text(json.dumps(results))


class Viewers:
    """`count` websocket viewers of one job, spread over `procs` helper processes; each reads
    from seq 0 until it has `until_seq` (or `until_stamped` stamped lines) or `timeout` s pass."""

    def __init__(self, base_url, job_id, token, count=1, until_seq=None, until_stamped=None, timeout=120,
                 procs=1, keep=False):
        self.ws_base = base_url.replace("http://", "ws://")
        self.job_id, self.token, self.count = job_id, token, count
        self.until_seq, self.until_stamped, self.timeout = until_seq, until_stamped, timeout
        self.procs, self.keep = min(procs, count), keep
        self.processes = []

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.kill()

    def start(self):
        per = [self.count // self.procs + (1 if k < self.count % self.procs else 0) for k in range(self.procs)]
        for k, count in enumerate(per):
            out = DATA_DIR / f"viewers-{self.job_id}-{k}-{time.monotonic_ns()}.json"
            argv = [PYTHON, str(Path(__file__)), "viewers", "--url", self.ws_base, "--job", str(self.job_id),
                    "--token", self.token, "--count", str(count), "--timeout", str(self.timeout), "--out", str(out)]
            if self.until_seq is not None:
                argv += ["--until-seq", str(self.until_seq)]
            if self.until_stamped is not None:
                argv += ["--until-stamped", str(self.until_stamped)]
            if self.keep:
                argv.append("--keep")
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
            process.out = out
            self.processes.append(process)
        for process in self.processes:
            line = _readline(process.stdout, 120)
            if line.strip() != "ready":
                self.kill()
                raise RuntimeError(f"viewers did not connect (got {line!r})")
        return self

    def wait(self):
        results = []
        for process in self.processes:
            process.wait(timeout=self.timeout + 60)
            results.extend(json.loads(Path(process.out).read_text()))
        self.processes = []
        return results

    def kill(self):
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes = []


def _readline(stream, timeout):
    box = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return box[0] if box else ""


# ------------------------------------------------------------------------------------------
# Reporting
# ------------------------------------------------------------------------------------------

def machine():
    load = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def add_web_options(parser):
    """--web-env and --uvicorn-arg, for benchmarks that compare uvicorn settings."""
    parser.add_argument("--web-env", action="append", default=[], metavar="NAME=VALUE",
                        help="an extra setting for uvicorn, e.g. DATABASE_CONN_MAX_AGE=60 (repeatable)")
    parser.add_argument("--uvicorn-arg", action="append", default=[], metavar="ARG",
                        help="an extra uvicorn option, e.g. --uvicorn-arg=--ws-per-message-deflate=false")


def start_web(services, args):
    """uvicorn with the settings of add_web_options; returns its URL."""
    web_env = dict(item.split("=", 1) for item in args.web_env)
    url = services.web(web_env, args.uvicorn_arg)
    if web_env or args.uvicorn_arg:
        print(f"uvicorn runs with {web_env} {' '.join(args.uvicorn_arg)}")
    return url


def header(title):
    print(f"== {title} ==")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M:%S')}   machine: {machine()}")


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, digits=1):
    return "n/a" if value is None else f"{value:,.{digits}f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    viewers = commands.add_parser("viewers")
    viewers.add_argument("--url", required=True)
    viewers.add_argument("--job", type=int, required=True)
    viewers.add_argument("--token", required=True)
    viewers.add_argument("--count", type=int, default=1)
    viewers.add_argument("--until-seq", type=int)
    viewers.add_argument("--until-stamped", type=int)
    viewers.add_argument("--timeout", type=float, default=120)
    viewers.add_argument("--keep", action="store_true")
    viewers.add_argument("--out", required=True)
    write = commands.add_parser("write")
    write.add_argument("--out", required=True)
    write.add_argument("--rate", type=float, required=True)
    write.add_argument("--seconds", type=float, required=True)
    write.add_argument("--ranks", type=int, default=8)
    write.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "viewers":
        asyncio.run(_viewers_main(args))
    else:
        write_paced(args.out, args.rate, args.seconds, args.ranks, args.seed)


if __name__ == "__main__":
    main()
