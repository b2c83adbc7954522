"""`ringmaster`: submit, follow, list, tag, annotate and cancel jobs from a terminal, and manage
where their notifications go (cli/notifications.py).

A plain client of the REST API and the job websocket (contracts in DESIGN.md). It imports
nothing of the portal and no Django, so it runs wherever `requests`, `websockets` and `pathspec`
(a folder's .gitignore rules, cli/pack.py) are.

Configuration: RINGMASTER_URL and RINGMASTER_TOKEN, else `url` and `token` in the [ringmaster]
section of $RINGMASTER_CONFIG (default ~/.config/ringmaster/config.ini). The environment wins.
The token only ever travels in the Authorization header; it is never printed.

Exit codes: 0 done (for `logs -f`: the job succeeded), 1 failed (job failed or not found, cancel
refused, portal unreachable), 2 bad input or configuration.
"""
import argparse
import configparser
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import requests
from websockets.exceptions import InvalidStatus, WebSocketException
from websockets.sync.client import connect

from cli import notifications, pack, studies

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL_STATES = {"SUCCEEDED", "FAILED", "CANCELLED"}
PAGE_LINES = 1000
HTTP_TIMEOUT = 30
BACKOFF_FIRST, BACKOFF_MAX = 0.5, 5.0
PACK_IN_MEMORY = 64 << 20    # a packed folder past this many bytes waits on disk for its upload
GIVE_UP_AFTER = 300          # seconds without reaching the portal before `logs -f` stops trying
TOKEN_HELP = ("Set RINGMASTER_TOKEN, or `token = <key>` in the [ringmaster] section of {path}. "
              "Make a key on the portal's Settings page (/settings/), or an admin runs "
              "`python manage.py create_api_token <username>`.")


class CliError(Exception):
    """A message for the user and the exit code that goes with it."""

    def __init__(self, message, code=1):
        super().__init__(message)
        self.code = code


class NotFound(CliError):
    pass


class Unreachable(CliError):
    """The portal could not be reached or failed (5xx): worth retrying while following."""


class FieldErrors(CliError):
    """A 400 answer: {"field": ["message", ...]}."""

    def __init__(self, errors):
        self.errors = errors
        lines = []
        for field, messages in (errors.items() if isinstance(errors, dict) else [("", errors)]):
            for message in messages if isinstance(messages, list) else [messages]:
                prefix = "" if field in ("", "non_field_errors") else f"{field}: "
                lines.append(f"{prefix}{message}")
        super().__init__("\n".join(lines) or "the portal refused the request", code=2)


# --- configuration ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    url: str
    token: str | None
    path: Path           # the config file that was (or would have been) read

    def __repr__(self):  # never show the token, not even in a traceback
        return f"Config(url={self.url!r}, token={'set' if self.token else None}, path={str(self.path)!r})"


def config_path(environ):
    if environ.get("RINGMASTER_CONFIG"):
        return Path(environ["RINGMASTER_CONFIG"]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".config")
    return Path(base) / "ringmaster" / "config.ini"


def load_config(environ=None):
    """The portal URL and token: environment first, then the config file, then defaults."""
    environ = os.environ if environ is None else environ
    path = config_path(environ)
    values = {}
    if environ.get("RINGMASTER_CONFIG") and not path.is_file():
        raise CliError(f"RINGMASTER_CONFIG names {path}, which is not a file", code=2)
    if path.is_file():
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, OSError, UnicodeDecodeError) as exc:
            raise CliError(f"cannot read {path}: {exc.__class__.__name__}", code=2) from None
        if parser.has_section("ringmaster"):
            values = dict(parser["ringmaster"])
    url = (environ.get("RINGMASTER_URL") or values.get("url") or DEFAULT_URL).strip().rstrip("/")
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        raise CliError(f"the portal URL must look like http://host:port, not {url!r}", code=2)
    token = (environ.get("RINGMASTER_TOKEN") or values.get("token") or "").strip() or None
    return Config(url=url, token=token, path=path)


# --- HTTP -------------------------------------------------------------------------------------

class Client:
    def __init__(self, config):
        if not config.token:
            raise CliError("no API token. " + TOKEN_HELP.format(path=config.path), code=2)
        self.config = config
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {config.token}"

    def request(self, method, path, expect=(200,), missing="not found", **kwargs):
        """The JSON of an answer whose status is in `expect` (None for 204); a 404 is NotFound
        saying `missing`."""
        url = self.config.url + path
        try:
            response = self.session.request(method, url, timeout=HTTP_TIMEOUT, **kwargs)
        except requests.RequestException as exc:
            raise Unreachable(f"cannot reach the portal at {self.config.url} ({exc.__class__.__name__})") from None
        status = response.status_code
        if status in expect:
            return _json(response) if status != 204 else None
        if status in (401, 403):
            raise CliError(f"the portal refused the token (HTTP {status}). "
                           + TOKEN_HELP.format(path=self.config.path), code=2)
        if status == 404:
            raise NotFound(missing)
        if status == 400:
            raise FieldErrors(_json(response))
        if status == 409:
            raise CliError(_json(response).get("detail", "conflict"))
        if status >= 500:
            raise Unreachable(f"the portal failed (HTTP {status})")
        raise CliError(f"unexpected answer from the portal: HTTP {status}")

    def job(self, job_id):
        try:
            return self.request("GET", f"/api/jobs/{job_id}/")
        except NotFound:
            raise NotFound(f"job {job_id} not found") from None

    def websocket(self, job_id, since):
        parts = urlsplit(self.config.url)
        scheme = "wss" if parts.scheme == "https" else "ws"
        url = urlunsplit((scheme, parts.netloc, f"{parts.path}/ws/jobs/{job_id}/", f"since={since}", ""))
        return connect(url, additional_headers={"Authorization": f"Token {self.config.token}"},
                       max_size=None, open_timeout=HTTP_TIMEOUT)


def _json(response):
    try:
        return response.json()
    except ValueError:
        raise CliError(f"the portal answered HTTP {response.status_code} without JSON") from None


# --- output -----------------------------------------------------------------------------------

def format_line(line):
    """`[rank] text`; a stderr line says so: `[rank stderr] text`."""
    stream = "" if line["stream"] == "stdout" else f" {line['stream']}"
    return f"[{line['rank']}{stream}] {line['text']}"


def rank_matches(line, rank):
    return rank is None or str(line["rank"]) == rank


def write_lines(lines, rank=None):
    for line in lines:
        if rank_matches(line, rank):
            sys.stdout.write(format_line(line) + "\n")
    sys.stdout.flush()


def warn(message):
    print(f"ringmaster: {message}", file=sys.stderr, flush=True)


def stored_pages(client, job_id, since=-1, rank=None):
    """The stored lines after `since`, a page at a time: (lines, the last seq of the page)."""
    params = {"limit": PAGE_LINES} | ({"rank": rank} if rank is not None else {})
    while True:
        try:
            page = client.request("GET", f"/api/jobs/{job_id}/logs/", params={**params, "since": since})
        except NotFound:
            raise NotFound(f"job {job_id} not found") from None
        since = page["next"]
        yield page["lines"], since
        if len(page["lines"]) < PAGE_LINES:
            return


class Backoff:
    """Waits longer after each failure; gives up after GIVE_UP_AFTER seconds of failures."""

    def __init__(self, give_up_after=GIVE_UP_AFTER):
        self.give_up_after = give_up_after
        self.failing_since = None
        self.delay = BACKOFF_FIRST

    def failed(self, reason):
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
            warn(f"lost the portal ({reason}); reconnecting")
        elif now - self.failing_since > self.give_up_after:
            raise Unreachable(f"gave up after {self.give_up_after} s without the portal ({reason})")
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, BACKOFF_MAX)

    def succeeded(self):
        if self.failing_since is not None:
            warn("reconnected")
        self.failing_since, self.delay = None, BACKOFF_FIRST


class LogFollower:
    """`logs -f`: the websocket from the last seq printed, reconnecting when it drops, until the
    job ends; then the stored lines after the last seq, so none is lost or printed twice."""

    def __init__(self, client, job_id, rank=None):
        self.client, self.job_id, self.rank = client, job_id, rank
        self.last_seq = -1
        self.last_state = None
        self.backoff = Backoff()

    def run(self):
        self.client.job(self.job_id)                     # "job N not found" before anything else
        while not self._stream():
            pass
        job = self._retry(self._drain)
        reason = f": {job['reason']}" if job.get("reason") else ""
        warn(f"job {self.job_id} {job['state']}{reason}")
        return 0 if job["state"] == "SUCCEEDED" else 1

    def _stream(self):
        """One websocket connection; True once the job has ended."""
        try:
            with self.client.websocket(self.job_id, self.last_seq) as ws:
                self.backoff.succeeded()
                for raw in ws:
                    if self._handle(raw):
                        return True
            reason = "the portal closed the connection"
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status < 500:
                raise CliError(f"the portal refused to stream job {self.job_id} (HTTP {status})") from None
            reason = f"HTTP {status}"
        except (OSError, TimeoutError, WebSocketException, json.JSONDecodeError) as exc:
            reason = exc.__class__.__name__
        self.backoff.failed(reason)
        return False

    def _handle(self, raw):
        message = json.loads(raw)
        if message.get("type") == "lines":
            fresh = [line for line in message["lines"] if line["seq"] > self.last_seq]
            write_lines(fresh, self.rank)
            if fresh:
                self.last_seq = fresh[-1]["seq"]
        elif message.get("type") == "state":
            if message.get("state") in TERMINAL_STATES:
                return True
            state = (message.get("state"), message.get("reason") or "")
            if state != self.last_state:                 # e.g. why it still waits in the queue
                self.last_state = state
                warn(f"job {self.job_id} {state[0]}" + (f": {state[1]}" if state[1] else ""))
        return False

    def _drain(self):
        for lines, last in stored_pages(self.client, self.job_id, self.last_seq, self.rank):
            write_lines(lines)
            self.last_seq = last                         # a retry goes on after this page
        return self.client.job(self.job_id)

    def _retry(self, action):
        while True:
            try:
                result = action()
            except Unreachable as exc:
                self.backoff.failed(str(exc))
                continue
            self.backoff.succeeded()
            return result


# --- commands ---------------------------------------------------------------------------------

def cmd_submit(client, args):
    body = {"image": args.image, "gpus": args.gpus, "args": args.script_args}
    if args.script and args.script_path:
        raise CliError("give a local script or --script-path, not both", code=2)
    if args.entry is not None and not (args.script and Path(args.script).is_dir()):
        raise CliError("--entry goes with a folder: `ringmaster submit ./my-project --entry train.py`", code=2)
    if args.script_path:
        body["script_path"] = args.script_path
    elif not args.script:
        raise CliError("give the script to run: a local file or folder, or --script-path <path inside the image>",
                       code=2)
    elif Path(args.script).is_dir():
        body.update(_upload_folder(client, Path(args.script), args.entry))
    else:
        path = Path(args.script)
        if not path.is_file():
            raise CliError(f"{args.script}: no such file (for a path inside the image, use --script-path)", code=2)
        with open(path, "rb") as handle:
            script = client.request("POST", "/api/scripts/", expect=(201,), files={"file": (path.name, handle)})
        body["script"] = script["id"]
    for key, value in (("name", args.name), ("launcher", args.launcher), ("backend", args.backend),
                       ("gpu_model", args.gpu_model), ("group", args.group), ("time_limit_minutes", args.time_limit),
                       ("max_gpus", args.max_gpus), ("checkpoint_pattern", args.checkpoint_pattern),
                       ("max_restarts", args.max_restarts)):
        if value is not None:
            body[key] = value
    if args.restart_on_exit_code:
        body["restart_on_exit_codes"] = args.restart_on_exit_code
    if args.restart_on:
        body["restart_on"] = args.restart_on
    body.update(_checked_backend_options(client, args.backend, args.backend_options))
    if args.env:
        body["env"] = dict(args.env)
    if args.tag:
        body["tags"] = args.tag
    if args.note is not None:
        body["note"] = args.note
    job = client.request("POST", "/api/jobs/", expect=(201,), json=body)
    for warning in job.get("warnings") or []:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    if args.quiet:
        print(job["id"], flush=True)
    else:
        print(f"job {job['id']} submitted ({job['state']}): {job.get('url', '')}", flush=True)
    return LogFollower(client, job["id"]).run() if args.follow else 0


def _upload_folder(client, folder, entry):
    """Pack the folder (cli/pack.py), say what is left out and what is sent, upload it as a
    project: {"project": id, "entry_point": path} for the job."""
    if entry is None:
        raise CliError(f"{folder} is a folder: name the .py file the job starts with --entry "
                       "(relative to the folder, e.g. --entry train.py)", code=2)
    try:
        selection = pack.select(folder)
        entry_point = pack.entry_point(selection, entry)
        with tempfile.SpooledTemporaryFile(max_size=PACK_IN_MEMORY) as archive:
            pack.write_tar_gz(selection, archive)
            for line in pack.summary(selection):
                warn(line)
            warn(f"sending {len(selection.files):,} file{'s' if len(selection.files) != 1 else ''}, "
                 f"{pack.human_size(selection.size)} (packed: {pack.human_size(archive.tell())}) from {folder}")
            archive.seek(0)
            try:
                project = client.request("POST", "/api/projects/", expect=(201,),
                                         files={"file": (f"{pack.TOP}.tar.gz", archive, "application/gzip")})
            except FieldErrors as refused:           # over the portal's limits: its own words
                raise CliError(f"the portal refused the packed folder: {_messages(refused.errors)}", code=2) from None
    except pack.PackError as exc:
        raise CliError(str(exc), code=2) from None
    warn(f"project {project['id']}: sha256 {project['sha256']}")
    return {"project": project["id"], "entry_point": entry_point}


def _messages(errors):
    """The messages of a 400's field errors, in one line."""
    values = errors.values() if isinstance(errors, dict) else [errors]
    return " ".join(str(message) for value in values for message in (value if isinstance(value, list) else [value]))


def _checked_backend_options(client, backend, options):
    """The backend options given to submit (`--cluster gpu-a`: {"cluster": "gpu-a"}), once the
    portal says a backend has them (the one asked for, or any): a mistyped one is an error here,
    not a field the portal would be sent and the job run without."""
    if not options:
        return {}
    offered = client.request("GET", "/api/backends/")
    known = {name for entry in offered if backend in (None, entry["name"]) for name in entry["fields"]}
    for name in options:
        if name not in known:
            where = f"the {backend} backend has no such option" if backend else "no backend has such an option"
            have = ", ".join(f"--{field.replace('_', '-')}" for field in sorted(known)) or "none"
            raise CliError(f"--{name.replace('_', '-')}: {where} (its options: {have}; "
                           "`ringmaster backends` lists every backend's; the script's arguments go after `--`)",
                           code=2)
    return options


def cmd_backends(client, args):
    """The backends jobs may go to, and the options of their own that submit passes on."""
    for entry in client.request("GET", "/api/backends/"):
        print(f"{entry['name']}: {entry['label']}" + (f" (unavailable: {entry['unavailable']})"
                                                      if entry.get("unavailable") else ""))
        for name, words in sorted(entry["fields"].items()):
            print(f"  --{name.replace('_', '-')} VALUE  {words}")
    return 0


def cmd_logs(client, args):
    if args.follow:
        return LogFollower(client, args.job_id, args.rank).run()
    for lines, _ in stored_pages(client, args.job_id, rank=args.rank):
        write_lines(lines)
    return 0


def _gpus_cell(job):
    """"4", or for an elastic job its size now and its bounds: "3 (2..4)"."""
    if not job.get("max_gpus"):
        return str(job["gpus"])
    return f"{job.get('size') or job['gpus']} ({job['gpus']}..{job['max_gpus']})"


def cmd_ls(client, args):
    params = {"limit": args.limit} | ({"state": args.state} if args.state else {}) | \
        ({"tag": args.tag} if args.tag else {})
    page = client.request("GET", "/api/jobs/", params=params)
    jobs = page["results"]
    if not jobs:
        warn("no jobs")
        return 0
    warn(f"times in {local_zone()}")
    rows = [("ID", "NAME", "STATE", "GPUS", "BACKEND", "CREATED", "TAGS", "REASON")]
    rows += [(str(job["id"]), job["name"] or "-", job["state"], _gpus_cell(job), job["backend"],
              _local_time(job["created_at"]), ",".join(job.get("tags") or []) or "-",
              " ".join((job["reason"] or "").split())) for job in jobs]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    if page.get("count", 0) > len(jobs):
        warn(f"showing {len(jobs)} of {page['count']} jobs (--limit N shows more)")
    return 0


def _patch_job(client, job_id, body):
    try:
        return client.request("PATCH", f"/api/jobs/{job_id}/", json=body)
    except NotFound:
        raise NotFound(f"job {job_id} not found") from None


def cmd_tag(client, args):
    """Add and remove tags (the others stay); print the job's tags, one a line."""
    tags = client.job(args.job_id).get("tags") or []
    if args.add or args.remove:
        removed = {" ".join(tag.split()) for tag in args.remove}       # as the portal stores them
        tags = [tag for tag in tags if tag not in removed] + [tag for tag in args.add if tag not in removed]
        tags = _patch_job(client, args.job_id, {"tags": tags})["tags"]
    for tag in tags:
        print(tag)
    return 0


def cmd_note(client, args):
    """Set the job's note (TEXT, or standard input with "-"; "" clears it), or print it."""
    if args.text is None:
        note = client.job(args.job_id).get("note") or ""
    else:
        text = sys.stdin.read() if args.text == "-" else args.text
        note = _patch_job(client, args.job_id, {"note": text})["note"]
    if note:
        print(note)
    return 0


def cmd_cancel(client, args):
    try:
        job = client.request("POST", f"/api/jobs/{args.job_id}/cancel/", expect=(202,))
    except NotFound:
        raise NotFound(f"job {args.job_id} not found") from None
    if job["state"] == "CANCELLED":
        print(f"job {job['id']} cancelled")
    else:
        print(f"job {job['id']}: cancel requested; its processes are being stopped")
    return 0


def local_zone(now=None):
    """The zone _local_time() prints in, named: "Asia/Kolkata (UTC+05:30)", "CET (UTC+01:00)"."""
    now = now or datetime.now().astimezone()
    offset = now.strftime("%z") or "+0000"
    offset = f"UTC{offset[:3]}:{offset[3:5]}"
    name = _zone_name() or now.tzname()
    return f"{name} ({offset})" if name and not name.startswith(("+", "-", "UTC+", "UTC-")) else offset


def _zone_name():
    """The IANA name of this machine's zone, from $TZ or /etc/localtime, where it says one."""
    named = os.environ.get("TZ", "").lstrip(":")
    if named and ("/" in named or named.upper() in ("UTC", "GMT")) and not named.startswith("/"):
        return named
    if named:
        return None                     # a POSIX rule ("EST5EDT"): the abbreviation says more
    try:
        target = os.readlink("/etc/localtime")
    except OSError:
        return None
    return target.partition("zoneinfo/")[2] or None


def _local_time(value):
    try:
        return datetime.fromisoformat(value).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError):
        return str(value)


# --- arguments --------------------------------------------------------------------------------

def _env_pair(text):
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=value, got {text!r}")
    return name, value


def _rank(text):
    if text == "launcher" or text.isdigit():
        return text
    raise argparse.ArgumentTypeError('a rank number or "launcher"')


def _positive(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def build_parser():
    parser = argparse.ArgumentParser(
        prog="ringmaster", description="Submit, follow, list, tag and cancel Ringmaster training jobs.",
        epilog="Configuration: RINGMASTER_URL and RINGMASTER_TOKEN, or url/token in the [ringmaster] "
               "section of $RINGMASTER_CONFIG (default ~/.config/ringmaster/config.ini).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    submit = commands.add_parser(
        "submit", help="submit a job", usage="ringmaster submit --image I --gpus N [options] "
        "(script.py | folder --entry E | --script-path P) [-- args...]",
        description="Upload a script, or a folder as a project, and submit a job. Everything after `--` goes "
                    "to the script. A folder is packed without .git/, what its .gitignore files and a "
                    ".ringmasterignore at its root match, and symbolic links; what is left out is listed.",
        epilog="A backend's own options are passed on as given, e.g. --cluster NAME for Kubernetes "
               "(`ringmaster backends` lists them).")
    parser.submit = submit
    submit.add_argument("script", nargs="?", help="a local script, or a folder, to upload")
    submit.add_argument("--entry", metavar="PATH",
                        help="with a folder: its .py file the job starts, relative to it (e.g. train.py)")
    submit.add_argument("--script-path", help="run this path inside the image instead of uploading")
    submit.add_argument("--image", required=True, help="image name or id (see the portal's catalog)")
    submit.add_argument("--gpus", required=True, type=int, help="number of GPUs (one process each)")
    submit.add_argument("--launcher", choices=["horovod", "torchrun"],
                        help="what starts the ranks: horovodrun or torchrun (default: the image's, horovod "
                             "where it carries both)")
    submit.add_argument("--max-gpus", type=int, metavar="N",
                        help="make the job elastic: it may grow to N GPUs (--gpus is its minimum); "
                             "the script must use hvd.elastic")
    submit.add_argument("--name", help="a name for the job")
    submit.add_argument("--env", action="append", type=_env_pair, default=[], metavar="NAME=VALUE",
                        help="an environment variable of the job (repeatable)")
    submit.add_argument("--backend", help="local, instances or kubernetes (default: the portal's)")
    submit.add_argument("--gpu-model", metavar="MODEL",
                        help="only GPUs whose nvidia-smi name contains this, e.g. A100 (instances, this machine)")
    submit.add_argument("--group", help="the group (team) the job's GPUs are charged to (default: yours)")
    submit.add_argument("--time-limit", type=int, metavar="MIN", help="time limit in minutes")
    submit.add_argument("--tag", action="append", default=[], metavar="TAG",
                        help="a tag to find the job by (repeatable)")
    submit.add_argument("--note", metavar="TEXT", help="why you run the job (shown on its page)")
    submit.add_argument("--checkpoint-pattern", metavar="GLOB",
                        help="names the job's checkpoints among what it writes under $RINGMASTER_OUTPUT_DIR, "
                             "e.g. '*.pt'; a restart or a rerun from checkpoint gets the newest in $RINGMASTER_CHECKPOINT")
    submit.add_argument("--max-restarts", type=int, metavar="N",
                        help="start the job again, from its newest checkpoint, up to N times after an attempt "
                             "fails with a cause below (default 0)")
    submit.add_argument("--restart-on-exit-code", action="append", type=int, default=[], metavar="CODE",
                        help="an exit code that earns a restart, e.g. 137 (repeatable)")
    submit.add_argument("--restart-on", action="append", default=[], metavar="CAUSE",
                        help="another cause that earns a restart: signal, oom, lost_host, preempted (repeatable)")
    submit.add_argument("-f", "--follow", action="store_true", help="then follow its logs to the end")
    submit.add_argument("-q", "--quiet", action="store_true", help="print only the job id")

    logs = commands.add_parser("logs", help="print a job's output", description="Print a job's output as "
                               "`[rank] text` lines, in order.")
    logs.add_argument("job_id", type=int)
    logs.add_argument("-f", "--follow", action="store_true",
                      help="stream new lines until the job ends; exit 0 if it succeeded, else 1")
    logs.add_argument("--rank", type=_rank, help='only this rank ("launcher": horovodrun\'s own lines)')

    ls = commands.add_parser("ls", help="list your jobs, newest first (times in this machine's zone, named on stderr)")
    ls.add_argument("--state", help="only jobs in this state (e.g. RUNNING)")
    ls.add_argument("--limit", type=_positive, default=50, help="at most this many (default 50)")
    ls.add_argument("--tag", action="append", default=[], metavar="TAG",
                    help="only jobs with this tag (repeatable: jobs with every one)")

    tag = commands.add_parser("tag", help="add or remove a job's tags, and print them",
                              description="Change a job's tags (the others stay), then print them, one a line. "
                                          "With neither --add nor --remove, print them only.")
    tag.add_argument("job_id", type=int)
    tag.add_argument("--add", action="append", default=[], metavar="TAG", help="add this tag (repeatable)")
    tag.add_argument("--remove", action="append", default=[], metavar="TAG", help="remove this tag (repeatable)")

    note = commands.add_parser("note", help="set or print a job's note",
                               description='Set a job\'s note to TEXT ("-": read it from standard input; '
                                           '"": clear it), or print it when no TEXT is given.')
    note.add_argument("job_id", type=int)
    note.add_argument("text", nargs="?", metavar="TEXT")

    commands.add_parser("backends", help="list the backends and the options of their own that submit takes",
                        description="The backends jobs may go to, each with the options of its own that "
                                    "`ringmaster submit` passes on (e.g. --cluster on Kubernetes).")

    cancel = commands.add_parser("cancel", help="cancel a job")
    cancel.add_argument("job_id", type=int)
    notifications.add_command(commands, _positive)
    studies.add_command(commands)
    return parser


def parse_args(argv):
    """Arguments after the first `--` belong to the training script (submit only)."""
    argv = list(argv)
    script_args = []
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    parser = build_parser()
    backend_options = {}
    if argv and argv[0] == "submit":
        argv, backend_options = _backend_options(parser, parser.submit, argv)
    args = parser.parse_args(argv)
    args.backend_options = backend_options
    if script_args and args.command != "submit":
        parser.error("arguments after `--` only go with submit")
    args.script_args = script_args
    return args


def _backend_options(parser, submit, argv):
    """Take out of submit's arguments the options that none of its flags takes: a backend's own
    (`--cluster gpu-a` or `--cluster=gpu-a`: {"cluster": "gpu-a"}, dashes read as underscores).
    Returns (the rest, those options)."""
    rest, options, words = [], {}, list(argv)
    while words:
        word = words.pop(0)
        name, equals, value = word.partition("=")
        if not name.startswith("--") or name in submit._option_string_actions:
            rest.append(word)
            action = submit._option_string_actions.get(name)
            if action is not None and action.nargs is None and not equals and words:
                rest.append(words.pop(0))                 # the flag's value, whatever it looks like
            continue
        if not re.fullmatch(r"--[a-z][a-z0-9-]*", name):
            parser.error(f"unrecognized argument: {word}")
        if not equals:
            if not words or words[0].startswith("--"):
                parser.error(f"{name}: a backend's option takes a value ({name} VALUE)")
            value = words.pop(0)
        options[name[2:].replace("-", "_")] = value
    return rest, options


def _version():
    try:
        from importlib.metadata import version

        return version("ringmaster")
    except Exception:  # not installed: running from a checkout
        return "0.1.0"


COMMANDS = {"submit": cmd_submit, "logs": cmd_logs, "ls": cmd_ls, "tag": cmd_tag, "note": cmd_note, "cancel": cmd_cancel,
            "backends": cmd_backends, "notifications": notifications.run, "study": studies.run}


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    try:
        return COMMANDS[args.command](Client(load_config()), args)
    except CliError as exc:
        for line in str(exc).splitlines():
            warn(line)
        return exc.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:                 # `ringmaster logs 7 | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
