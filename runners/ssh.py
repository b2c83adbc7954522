"""A job's launcher (horovodrun, or torchrun's agents) on interactive GPU instances, reached over
SSH (paramiko).

A job gets slots on one or more instances (hosts). On every host the runner makes two folders,
the same paths everywhere (Gloo runs every rank in the launcher's working directory):

- the job's own folder, <work_dir>/<spec.name>/, mode 0700: the script, ringmaster_metrics.py,
  the rank launcher and what the job writes. The ranks run there.
- its control folder, <work_dir>/.portal/<spec.name>/, mode 0700 and the SSH account's: what the
  portal trusts (output.log, pid, exit_code, the elastic job's hosts file and discovery script,
  the name of a rerun's checkpoint) and RANK_WRAPPER, which starts each rank. horovodrun runs there.

A job that runs a project (JobSpec.project, runners.projects.pack's archive) gets it on every host
before the launch: sent over the job's SSH connection into `tar`, which unpacks it as the job into
<job>/project (INSTALL_PROJECT); RANK_WRAPPER names that folder to each rank in
RINGMASTER_PROJECT_DIR, and the rank launcher starts the entry point there.

A rerun from a checkpoint (JobSpec.checkpoint) gets the file on every host before the launch: sent
over SFTP (or through `cat` where the server has no SFTP) into the control folder, then moved into
the job's folder, <job>/checkpoint/<name>, as the job (INSTALL_CHECKPOINT). RANK_WRAPPER names it
in RINGMASTER_CHECKPOINT for each rank, with the path on the rank's own host.

Where the instance's account is root or may run `sudo -n`, and setpriv is there, each job runs
under a uid of its own (PREPARE picks it, the control folder keeps it): its folder is that uid's,
every file the portal puts there is written as that uid, and RANK_WRAPPER starts each rank as
it, under bubblewrap (a private /tmp) where bwrap is installed. The job then cannot read
another job's folder, signal its processes, or write what the portal reads back. Elsewhere the
job runs under the account itself, as every other job there (jobs share one account).

On the first host the runner starts the job's launcher (runners.launchers: over_ssh), e.g.

    horovodrun --gloo -np N -H h1:s1,h2:s2 [-p P -i KEY] [--network-interface IF]
               --disable-cache --start-timeout T ./run-rank <python> -m ringmaster_rank

or torchrun_agents.py, which starts one torchrun agent per host,

detached from the SSH session (its own session and process group, `setsid`), with its output
appended to `output.log` and its exit code written to `exit_code` by the same wrapper as the
local runner. A Celery worker or portal restart therefore leaves training alone; the next
follower re-reads `output.log` from the byte offset the database kept.

Safety:
- Every remote word is quoted with shlex.quote; nothing a user typed reaches a shell unquoted.
- The job's own variables (JobSpec.env) reach only the job's own processes: they travel in a file
  of the job's folder (ENV_FILE, written as the job), never on a command line, and RANK_WRAPPER
  applies them after the switch to the job's uid. What runs as the account or as root (the
  launcher, the rank wrapper, sudo, setpriv, bwrap, cancel) has the instance's login
  environment, its setup line and the portal's own variables, and finds sudo, setpriv, bwrap,
  env and setsid on the system's PATH (SYSTEM_PATH): a PATH, LD_PRELOAD, BASH_ENV or PYTHONPATH
  a job sets never makes them run the job's code. paramiko forwards none of the worker's own
  environment.
- The portal verifies each instance's host key: the key recorded when the instance was added or
  first checked (trust on first use), and a connection to a host that shows another key is
  refused.

This module never imports Django: it gets a JobSpec and plain Host records.
"""
import io
import os
import re
import secrets
import shlex
import socket
import stat
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import paramiko

from . import gpus, launchers, limits, telemetry
from .artifacts import (CHECKPOINT_DIR, CHECKPOINT_VAR, MAX_DEPTH, MAX_ENTRIES, OUTPUT_DIR, OUTPUT_DIR_VAR,
                        Skipped, open_artifact, too_deep, too_many)
from .projects import PROJECT_DIR, PROJECT_DIR_VAR, UNTAR
from .sandbox import UID_BASE, UID_SPAN
from .base import (DISCOVERY_SCRIPT, DISCOVERY_SCRIPT_TEXT, EXIT_CODE_WRAPPER, GPU_MAP_FILE, HOSTS_FILE,
                   HOST_NAME_VAR, JOB_DIR_VAR, JOB_ID_VAR, Exited, Output, Placement, Runner, Started, Status,
                   Waiting)

JOB_PYTHON = Path(__file__).resolve().parent / "job_python"
READ_CHUNK = 1 << 20
POLLED_STATUS_SECONDS = 1.0    # polling output: is the launcher alive, when a read finds nothing
STREAMED_STATUS_SECONDS = 5.0  # streaming: the stream ends with the launcher; this notices a silent host
TROUBLE_SAID_AFTER = 10.0     # seconds of trouble reaching a host before the job's reason says so
MIN_FREE_KB = 10 * 1024
COPY_BYTES_PER_SECOND = 20e6  # the slowest disk an instance's copy of a checkpoint is given time for
CONTROL = ".portal"          # <work_dir>/.portal/<job>/: the control folders (a job's name never starts with a dot)
RANK_WRAPPER = "run-rank"
LIMITS_FILE = "prlimit"     # in the control folder: prlimit's options for each rank (runners.limits)
ENV_FILE = ".ringmaster-env"    # in the job's folder: the job's own variables (job_env_file)
# Where the tools that run as root or as the account at the switch to the job's uid are found,
# whatever PATH the shell that runs them has (Debian's sudo secure_path).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CHECKPOINT_NAME = "checkpoint-name"   # in the control folder: the rerun's checkpoint, once in the job's folder
PROJECT_INSTALLED = "project-installed"   # in the control folder: the project is in the job's folder
NO_HOST_KEY = object()


class InstanceError(Exception):
    """Something about an instance a user or admin can act on (unreachable, disk full...)."""


class HostKeyMismatch(InstanceError):
    pass


@dataclass(frozen=True)
class Host:
    """One instance and the slots a job has on it."""

    name: str                     # the admin's name for it (messages)
    address: str                  # host name or IP: the portal connects there, horovodrun -H uses it
    port: int
    user: str
    private_key: str              # PEM / OpenSSH text (decrypted only in memory)
    host_key: str = ""            # "<type> <base64>" recorded on first use; "" = not yet known
    slots: int = 0
    setup: str = ""               # a shell line run before horovodrun (e.g. `. /opt/venv/bin/activate`)
    work_dir: str = ".ringmaster/jobs"
    peer_ssh_port: int | None = None      # horovodrun -p: how this host reaches the others
    peer_ssh_key: str = ""                # horovodrun -i: a key file on this host
    network_interface: str = ""           # horovodrun --network-interface

    def where(self):
        return f"instance {self.name} ({self.user}@{self.address}:{self.port})"

    def job_dir(self, spec):
        return f"{self.work_dir.rstrip('/')}/{spec.name}"

    def control_dir(self, spec):
        return f"{self.work_dir.rstrip('/')}/{CONTROL}/{spec.name}"

    def __repr__(self):  # never show the key
        return f"Host({self.name!r}, {self.address}:{self.port}, slots={self.slots})"


def load_private_key(text):
    """A paramiko key from its text (OpenSSH or PEM; Ed25519, ECDSA or RSA)."""
    errors = []
    for kind in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return kind.from_private_key(io.StringIO(text))
        except (paramiko.SSHException, ValueError, TypeError) as exc:
            errors.append(type(exc).__name__)
    raise InstanceError("the SSH private key cannot be read (an unencrypted Ed25519, ECDSA or RSA key is needed)")


def host_key_line(key):
    return f"{key.get_name()} {key.get_base64()}"


def host_key_fingerprint(line):
    """SHA256:... of a "<type> <base64>" host key, as ssh-keygen -l shows it."""
    import base64
    import hashlib

    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


class _Record(paramiko.MissingHostKeyPolicy):
    """Trust on first use: accept the key of a host we have no key for, and remember it."""

    def __init__(self):
        self.seen = None

    def missing_host_key(self, client, hostname, key):
        self.seen = key


def connect(host, timeout=10.0):
    """An SSHClient logged in to `host`, and the host key line it showed.

    Fails fast (`timeout` for the TCP connect, the banner and the authentication) with a message
    that names the instance and what went wrong.
    """
    client = paramiko.SSHClient()
    known = host.host_key.strip()
    policy = _Record()
    if known:
        kind, blob = known.split()[:2]
        key = paramiko.PKey.from_type_string(kind, __import__("base64").b64decode(blob))
        name = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
        client.get_host_keys().add(name, kind, key)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
    else:
        client.set_missing_host_key_policy(policy)
    try:
        client.connect(host.address, port=host.port, username=host.user, pkey=load_private_key(host.private_key),
                       timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, channel_timeout=timeout,
                       allow_agent=False, look_for_keys=False)
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise HostKeyMismatch(
            f"{host.where()}: the host key changed (expected {host_key_fingerprint(known)}, got "
            f"{host_key_fingerprint(host_key_line(exc.key))}); refusing to connect. If the host was "
            f"reinstalled, clear the instance's host key in the admin.") from None
    except paramiko.AuthenticationException as exc:
        client.close()
        raise InstanceError(f"{host.where()}: SSH login refused: {exc}") from None
    except (socket.timeout, TimeoutError):
        client.close()
        raise InstanceError(f"{host.where()}: cannot reach the host: timed out after {timeout:.0f} s") from None
    except (OSError, paramiko.SSHException) as exc:
        client.close()
        # paramiko wraps the socket errors of each address it tried: show the first one's words.
        inner = next(iter(getattr(exc, "errors", {}).values()), exc)
        message = inner.strerror if isinstance(inner, OSError) and inner.strerror else str(exc) or type(exc).__name__
        raise InstanceError(f"{host.where()}: cannot reach the host: {message}") from None
    seen = client.get_transport().get_remote_server_key()
    return client, host_key_line(seen)


def execute(client, command, stdin=None, timeout=60.0, decode=True):
    """Run `command` (a shell string, already quoted) on the host, with `stdin` (bytes or an open
    binary file) as its input; (exit code, stdout, stderr), stdout as bytes where decode is False."""
    chan = client.get_transport().open_session(timeout=timeout)
    chan.settimeout(timeout)
    chan.exec_command(command)
    if isinstance(stdin, (bytes, bytearray)):
        chan.sendall(stdin)
    elif stdin is not None:                 # an open file: sent in pieces
        while chunk := stdin.read(READ_CHUNK):
            chan.sendall(chunk)
    chan.shutdown_write()
    out, err = bytearray(), bytearray()

    def drain(read, into):
        while True:
            data = read(65536)
            if not data:
                return
            into.extend(data)

    reader = threading.Thread(target=drain, args=(chan.recv_stderr, err), daemon=True)
    reader.start()
    drain(chan.recv, out)
    reader.join(timeout)
    code = chan.recv_exit_status()
    chan.close()
    return code, (out.decode(errors="replace") if decode else bytes(out)), err.decode(errors="replace")


def sh(script, *args):
    """A command line for the remote login shell that runs `script` in /bin/sh with `args` as
    $1.. : the login shell parses only quoted words, whatever kind of shell it is."""
    return " ".join(shlex.quote(word) for word in ("/bin/sh", "-c", script, "ringmaster", *args))


# `tool NAME`: NAME's absolute path on SYSTEM_PATH (nothing, and false, where it is not there).
TOOL = r"""
tool() ( PATH=""" + SYSTEM_PATH + r"""; command -v -- "$1" )
"""
# Every script below that gets a job's control folder ($1) goes there with at_control, which
# also names the job's own folder: <work_dir>/.portal/<job> is the control folder of <work_dir>/<job>.
AT_CONTROL = TOOL + r"""
at_control() {
    cd -- "$1" 2>/dev/null || return 1
    c=$(pwd -P); job=${c%/""" + CONTROL + r"""/*}/${c##*/}
}
"""
# Run "$@" as the job's uid where its control folder ($c) names one, else as this account. Only
# root changes uid: an account that is not root does it through `sudo -n` (-E keeps the rank's
# Horovod variables). `box`: under bubblewrap where it is installed (a private /tmp and SysV IPC;
# the network, the GPUs and /dev/shm stay the host's, which Gloo and NCCL need). `limited`:
# under the job's rlimits where the control folder holds them (LIMITS_FILE: prlimit's options,
# runners.limits) and prlimit is there; RLIMIT_NPROC counts per uid, so only for a uid of the
# job's own; `limited` in the control folder then says so (STATUS). `run=exec`: the command
# replaces this shell.
AS_JOB = r"""
as_job() {
    if [ -s "$c/uid" ]; then
        u=$(cat "$c/uid")
        set -- "$(tool setpriv)" --reuid="$u" --regid="$u" --clear-groups --no-new-privs -- "$@"
        if [ -n "$box" ] && b=$(tool bwrap); then
            set -- --unshare-ipc --die-with-parent -- "$@"
            # What the job needs under /tmp (its folder, its Python: PREPARE's list) stays, with
            # the folder of /tmp it is in.
            while IFS= read -r path; do
                case $path in
                    /tmp/?*) keep=${path#/tmp/}; keep=/tmp/${keep%%/*}; set -- --dev-bind "$keep" "$keep" "$@" ;;
                esac
            done < "$c/keep"
            set -- "$b" --dev-bind / / --perms 01777 --tmpfs /tmp "$@"
        fi
        if [ -n "$limited" ] && [ -s "$c/""" + LIMITS_FILE + r"""" ] && prl=$(tool prlimit); then
            set -- "$prl" $(cat "$c/""" + LIMITS_FILE + r"""") -- "$@"
            : > "$c/limited"
        fi
        [ "$(id -u)" = 0 ] || set -- "$(tool sudo)" -n -E -- "$@"
    fi
    $run "$@"
}
"""
# How this account gives a job a uid of its own: as root (as=), through `sudo -n` (as="sudo -n"),
# or not at all (as=none: neither, or no setpriv).
ACCOUNT = TOOL + r"""
if [ "$(id -u)" = 0 ]; then as=
elif s=$(tool sudo) && "$s" -n true 2>/dev/null; then as="$s -n"
else as=none; fi
tool setpriv >/dev/null || as=none
"""
# Make the job's two folders, mode 0700, and refuse when the disk is (nearly) full. $1 work dir,
# $2 the job's name, $3 min free KiB, $4 the first uid to try, $5 the setup line, $6 the job's
# Python. Prints "uid U" where the job gets a uid of its own (root, or `sudo -n`, and setpriv),
# else "shared". The uid is the first from $4 that no user, process or folder of the work dir
# has, under a lock; the folders above the job's folder and its Python get search permission
# (o+x, never read) so that the uid reaches them, and `keep` lists them (AS_JOB's bubblewrap
# keeps them where they are under /tmp).
PREPARE = ACCOUNT + r"""
umask 077
mkdir -p -- "$1/""" + CONTROL + r"""/$2" || exit 3
cd -- "$1" || exit 3
work=$(pwd -P)
chmod 700 -- """ + CONTROL + r""" """ + CONTROL + r"""/"$2" || exit 3
free=$(df -Pk . | awk 'NR==2 {print $4}')
if [ -n "$free" ] && [ "$free" -lt "$3" ]; then
    echo "disk full: only ${free} KiB free in $work" >&2; exit 28
fi
job=$work/$2
cd -- """ + CONTROL + r"""/"$2" || exit 3
if [ "$as" = none ]; then
    mkdir -p -- "$job" && chmod 700 -- "$job" || exit 3
    echo shared; exit 0
fi
if [ ! -s uid ]; then
    taken() {
        getent passwd "$1" >/dev/null 2>&1 && return 0
        stat -c %u -- /proc/[0-9]* 2>/dev/null | grep -qx "$1" && return 0
        [ -n "$(find "$work" -mindepth 1 -maxdepth 1 -uid "$1" 2>/dev/null | head -n 1)" ]
    }
    exec 9>> "$work/""" + CONTROL + r"""/uids.lock"
    if command -v flock >/dev/null 2>&1; then flock 9; fi
    u=$4
    while taken "$u"; do u=$((u + 1)); done
    $as mkdir -p -- "$job" && $as chown "$u:$u" -- "$job" && $as chmod 700 -- "$job" || exit 3
    echo "$u" > uid.tmp && mv uid.tmp uid || exit 3
    exec 9>&-
fi
u=$(cat uid)
if [ ! -d "$job" ]; then
    $as mkdir -p -- "$job" && $as chown "$u:$u" -- "$job" && $as chmod 700 -- "$job" || exit 3
fi
reach() {
    p=$1
    while p=$(dirname -- "$p") && [ "$p" != / ] && [ "$p" != . ]; do
        case $(stat -Lc %A -- "$p" 2>/dev/null) in
            *[xt]|"") ;;
            *) $as chmod o+x -- "$p" || return 1 ;;
        esac
    done
}
reach "$job" || { echo "cannot give the folders above $job search permission" >&2; exit 3; }
py=$( { eval "$5"; } >/dev/null 2>&1 </dev/null; command -v -- "$6" )
if [ -n "$py" ]; then reach "$py" && reach "$(readlink -f -- "$py")" || exit 3; fi
printf '%s\n' "$job" ${py:+"$py"} ${py:+"$(readlink -f -- "$py")"} > keep || exit 3
echo "uid $u"
"""
# Write stdin to file $2 of the control folder $1, atomically and executable by the account only
# (a temporary file of this shell's own: two runners launching the same job at once each write theirs).
UPLOAD_CONTROL = r"""
cd -- "$1" || exit 3
cat > ".$2.$$.tmp" && chmod 700 ".$2.$$.tmp" && mv -f -- ".$2.$$.tmp" "$2"
"""
# The same into the job's own folder, as the job's uid: nothing the job placed there (a link, a
# file of that name) makes the portal write anywhere the job could not. $1 the control folder.
UPLOAD_JOB = AT_CONTROL + AS_JOB + r"""
at_control "$1" || exit 3
as_job /bin/sh -c 'cd -- "$1" && cat > ".$2.$$.tmp" && mv -f -- ".$2.$$.tmp" "$2"' upload "$job" "$2"
"""
# Move a rerun's checkpoint, sent into the control folder $1 as file $2, to <job>/checkpoint/$3
# as the job's uid (as UPLOAD_JOB writes), then note its name in the control folder: RANK_WRAPPER
# names the file to each rank, and a retried launch finds it there and sends nothing.
INSTALL_CHECKPOINT = AT_CONTROL + AS_JOB + r"""
at_control "$1" || exit 3
as_job /bin/sh -c 'cd -- "$1" && mkdir -p -- "$2" && chmod 700 -- "$2" && cd -- "$2" &&
    cat > ".$3.$$.tmp" && mv -f -- ".$3.$$.tmp" "$3"' install "$job" """ + CHECKPOINT_DIR + r""" "$3" < "$c/$2" ||
    { rm -f -- "$c/$2"; exit 3; }
rm -f -- "$c/$2"
n=""" + CHECKPOINT_NAME + r"""
printf '%s' "$3" > "$c/.$n.$$.tmp" && mv -f -- "$c/.$n.$$.tmp" "$c/$n"
"""
# Unpack the project's archive (stdin: runners.projects.pack's, plain files only, every path inside
# it, checked when it was uploaded) into the job's folder as the job's uid (as UPLOAD_JOB writes),
# through a folder of its own that then replaces the project's folder whole, and note it in the
# control folder: RANK_WRAPPER names the folder to each rank, and a retried launch finds the note
# and unpacks nothing. $1 control folder.
INSTALL_PROJECT = AT_CONTROL + AS_JOB + r"""
at_control "$1" || exit 3
if [ -e "$c/""" + PROJECT_INSTALLED + r"""" ]; then cat > /dev/null; exit 0; fi
as_job /bin/sh -c 'cd -- "$1" && rm -rf -- ".$2.tmp" && mkdir -- ".$2.tmp" &&
    """ + UNTAR + r""" -f - -C ".$2.tmp" && rm -rf -- "$2" && mv -- ".$2.tmp" "$2"' \
    install "$job" """ + PROJECT_DIR + r""" || exit 3
: > "$c/""" + PROJECT_INSTALLED + r""""
"""
# Whether the job's folder holds its checkpoint already (INSTALL_CHECKPOINT ran). $1 control folder.
HAS_CHECKPOINT = r"""
[ -s "$1/""" + CHECKPOINT_NAME + r"""" ] && echo installed
exit 0
"""
# What the rank wrapper runs as the job (after the switch to its uid): in the job's folder ($1),
# `env` ($2) runs the rank with the job's own variables, which ENV_FILE puts first in "$@".
JOB_SHELL = ('cd -- "$1" || exit 3; e=$2; shift 2; '
             f'if [ -f ./{ENV_FILE} ]; then . ./{ENV_FILE}; fi; exec "$e" "$@"')
# Starts one rank (horovodrun runs it on every host, in the control folder): in the job's own
# folder, as the job's uid where there is one, whose home that folder is, with
# RINGMASTER_CHECKPOINT naming a rerun's checkpoint in that folder, RINGMASTER_PROJECT_DIR its
# project's folder (where the rank launcher starts the entry point), and the job's own variables
# (ENV_FILE) applied there only, by the job's own shell.
RANK_WRAPPER_TEXT = "#!/bin/sh\n" + AT_CONTROL + AS_JOB + r"""
at_control . || exit 3
box=1 limited=1 run=exec
if [ -s "$c/""" + CHECKPOINT_NAME + r"""" ]; then
    name=$(cat "$c/""" + CHECKPOINT_NAME + r""""; echo x)
    """ + CHECKPOINT_VAR + r"""=$job/""" + CHECKPOINT_DIR + r"""/${name%x}; export """ + CHECKPOINT_VAR + r"""
fi
if [ -e "$c/""" + PROJECT_INSTALLED + r"""" ]; then
    """ + PROJECT_DIR_VAR + r"""=$job/""" + PROJECT_DIR + r"""; export """ + PROJECT_DIR_VAR + r"""
fi
e=$(tool env) || exit 3
set -- /bin/sh -c '""" + JOB_SHELL + r"""' rank "$job" "$e" "$@"
if [ -s "$c/uid" ]; then set -- "$e" HOME="$job" PATH="$PATH" "$@"; fi
as_job "$@"
"""
# Start horovodrun once, in the control folder, under `env` with the portal's NAME=value words
# (never the job's own: those are in ENV_FILE). $1 control folder, $2 setup line, then the words
# and horovodrun's argv. `mkdir launched` is atomic: a retried launch finds it and only reports
# the pid.
LAUNCH = AT_CONTROL + r"""
at_control "$1" || exit 3
setup=$2
shift 2
if ! mkdir launched 2>/dev/null; then
    echo "already $(cat pid 2>/dev/null)"; exit 0
fi
if [ -n "$setup" ]; then
    eval "$setup" >> output.log 2>&1 </dev/null || {
        echo "the instance's setup line failed (exit $?)" >> output.log
        echo 1 > exit_code; echo "setup-failed"; exit 0; }
    cd -- "$c" || exit 3      # whatever directory the setup line went to
fi
""" + JOB_DIR_VAR + r"""=$job; export """ + JOB_DIR_VAR + r"""
""" + OUTPUT_DIR_VAR + r"""=$job/""" + OUTPUT_DIR + r"""; export """ + OUTPUT_DIR_VAR + r"""
e=$(tool env) && s=$(tool setsid) || { echo "env or setsid is missing from """ + SYSTEM_PATH + r"""" >&2; exit 3; }
"$s" /bin/sh -c '""" + EXIT_CODE_WRAPPER.replace("'", "'\\''") + r"""' ringmaster-job "$e" "$@" >> output.log 2>&1 </dev/null &
echo "$!" > pid.tmp && mv pid.tmp pid
echo "started $!"
"""
# Bytes of output.log (in control folder $1) from byte $2 (1-based), at most $3 of them; exit 44
# while there is none. For hosts whose sshd offers no SFTP subsystem.
READ = r"""
cd -- "$1" 2>/dev/null || exit 44
[ -f output.log ] || exit 44
tail -c +"$2" output.log | head -c "$3"
"""
# Stream output.log from byte $2 (1-based) as it grows until the job's launcher ends (GNU tail
# follows with inotify, and --pid ends it once the launcher is gone, after a last read); exit 44
# while there is no output.log, 45 where tail cannot follow a process (not GNU tail).
STREAM = r"""
cd -- "$1" 2>/dev/null || exit 44
[ -f output.log ] || exit 44
tail --pid="$$" -c +1 /dev/null >/dev/null 2>&1 || exit 45
pid=$(cat pid 2>/dev/null)
if [ -n "$pid" ] && [ ! -f exit_code ] && kill -0 "$pid" 2>/dev/null; then
    exec tail -c +"$2" --pid="$pid" -f output.log
fi
exec tail -c +"$2" output.log
"""
# Is the launcher alive? $1 control folder. Prints exit code if written, else alive/gone.
STATUS = r"""
cd -- "$1" 2>/dev/null || { echo missing; exit 0; }
limited=; [ -f limited ] && limited=1
if [ -f exit_code ]; then echo "exit $(cat exit_code)${limited:+ limited}"; exit 0; fi
if [ -f pid ] && kill -0 "$(cat pid)" 2>/dev/null; then echo alive; else echo gone; fi
"""
# The words after $1 (a control folder) as root where the job has a uid of its own and this
# account is not (sudo -n): only root signals the job's processes and reads their environment.
AS_ROOT = TOOL + r"""
if [ -s "$1/uid" ] && [ "$(id -u)" != 0 ]; then shift; exec "$(tool sudo)" -n -- "$@"; fi
shift; exec "$@"
"""
# Stop every process of the job on this host: the launcher's process group, then everything
# that carries the job-folder marker; TERM, a grace period, then KILL. $1 control folder, $2 grace s.
CANCEL = AT_CONTROL + r"""
at_control "$1" || exit 0
d=$job
marked() {
    for p in /proc/[0-9]*; do
        tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -qxF "RINGMASTER_JOB_DIR=$d" && echo "${p#/proc/}"
    done
}
[ -f pid ] && kill -TERM -- "-$(cat pid)" 2>/dev/null
left=$(marked); [ -n "$left" ] && kill -TERM $left 2>/dev/null
i=0
while [ -n "$(marked)" ] && [ "$i" -lt "$(( $2 * 5 ))" ]; do sleep 0.2; i=$((i + 1)); done
i=0
while left=$(marked); [ -n "$left" ] && [ "$i" -lt 50 ]; do
    [ -f pid ] && kill -KILL -- "-$(cat pid)" 2>/dev/null
    kill -KILL $left 2>/dev/null; sleep 0.2; i=$((i + 1))
done
[ -z "$(marked)" ] || { echo "processes survived SIGKILL: $(marked)" >&2; exit 1; }
"""


def sh_as_root(control, script, *args):
    """sh(script, *args), as root where the job in `control` has a uid of its own (AS_ROOT)."""
    return sh(AS_ROOT, control, "/bin/sh", "-c", script, "ringmaster", *args)

# A telemetry sample of one host. $1 setup line, $2 control folder, then nvidia-smi's argv for a
# job that owns GPUs there; with no argv, the CPU ticks and resident KiB of the job's processes.
SAMPLE = AT_CONTROL + r"""
eval "$1" >/dev/null 2>&1 </dev/null
at_control "$2" || { echo missing; exit 0; }
d=$job
shift 2
if [ "$#" -gt 0 ]; then
    if command -v timeout >/dev/null 2>&1; then set -- timeout 15 "$@"; fi
    "$@" || exit 94
    exit 0
fi
ticks=0; rss=0
for p in /proc/[0-9]*; do
    tr '\0' '\n' < "$p/environ" 2>/dev/null | grep -qxF "RINGMASTER_JOB_DIR=$d" || continue
    t=$(sed 's/.*) //' "$p/stat" 2>/dev/null | awk '{print $12 + $13}'); ticks=$((ticks + ${t:-0}))
    r=$(awk '/^VmRSS:/ {print $2}' "$p/status" 2>/dev/null); rss=$((rss + ${r:-0}))
done
echo "CPU $ticks $(getconf CLK_TCK) $rss $(awk '/^MemTotal:/ {print $2}' /proc/meminfo)"
"""
NVIDIA_SMI_MARK = "--- nvidia-smi ---"
NVIDIA_SMI_TIMEOUT = 20


# What proves that Horovod runs on a host: `--check-build` imports each framework Horovod was
# built for, each in a process of its own (about 10 CPU-seconds); `--version` only starts
# horovodrun under the login shell's Python (a fifth of a second).
HOROVOD_BUILD_PROBE = "horovodrun --check-build"
HOROVOD_RUNS_PROBE = "horovodrun --version"


def build_report(text):
    """{section: {name: built}} of what `horovodrun --check-build` prints, e.g.
    {"Frameworks": {"PyTorch": True, ...}, "Controllers": {"Gloo": True, "MPI": False}, ...}."""
    sections, current = {}, None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("Available ") and line.endswith(":"):
            current = sections.setdefault(line[len("Available "):-1], {})
        elif current is not None and (item := re.fullmatch(r"\[([X ])\] (.+)", line)):
            current[item.group(2).strip()] = item.group(1) == "X"
    return sections


def build_lacks(text):
    """What the portal's jobs need that a `--check-build` report says is missing: a framework,
    and the Gloo controller (jobs run `horovodrun --gloo`). horovodrun exits 0 either way."""
    report = build_report(text)
    frameworks = report.get("Frameworks", {})
    lacks = []
    if not any(frameworks.values()):
        lacks.append(f"a framework ({', '.join(frameworks) or 'none listed'})")
    if not report.get("Controllers", {}).get("Gloo"):
        lacks.append("the Gloo controller")
    return lacks


# How jobs run on an instance, by what its account can do (ACCOUNT) and whether bubblewrap is there.
ISOLATIONS = {
    "uid+bwrap": "each job under a uid of its own, with a private /tmp (bubblewrap): "
                 "a job cannot read another job's files or signal its processes",
    "uid": "each job under a uid of its own: a job cannot read another job's files or signal its processes",
    "shared": "every job under the one SSH account (neither root nor allowed `sudo -n`), so jobs there "
              "can read each other's files and signal each other's processes",
}


def check(host, timeout=10.0, build=True):
    """A health check: (host key line, [Gpu] nvidia-smi lists or None without nvidia-smi, how
    jobs run there: ISOLATIONS' key). Raises InstanceError.

    Reachable, logged in, horovodrun runs after the setup line (`build`: `--check-build`, its
    frameworks load; else `--version`, it starts), and each GPU (index, name, memory) where
    nvidia-smi exists. An nvidia-smi that fails, hangs or prints something else than its CSV
    makes the check fail, quoting it: no job is placed on GPUs the portal could not see.
    """
    probe = HOROVOD_BUILD_PROBE if build else HOROVOD_RUNS_PROBE
    client, seen = connect(host, timeout)
    try:
        script = 'mkdir -p -- "$2" && cd -- "$2" || exit 92\n' \
                 'd=$(pwd)\n' \
                 'eval "$1" >/dev/null 2>&1 </dev/null || { echo "the setup line failed" >&2; exit 90; }\n' \
                 'cd -- "$d" || exit 92\n' \
                 'free=$(df -Pk . | awk \'NR==2 {print $4}\')\n' \
                 'if [ -n "$free" ] && [ "$free" -lt "$3" ]; then\n' \
                 '  echo "disk full: only ${free} KiB free in $(pwd)" >&2; exit 93\nfi\n' \
                 'if [ "$as" = none ]; then echo "ISOLATION shared"\n' \
                 'elif command -v bwrap >/dev/null 2>&1; then echo "ISOLATION uid+bwrap"\n' \
                 'else echo "ISOLATION uid"; fi\n' \
                 f'{probe} 2>&1 || exit 91\n' \
                 'if command -v nvidia-smi >/dev/null 2>&1; then\n' \
                 '  echo "$4"; shift 4\n' \
                 '  if command -v timeout >/dev/null 2>&1; then set -- timeout "$NVIDIA_SMI_TIMEOUT" "$@"; fi\n' \
                 '  "$@" 2>&1; code=$?\n' \
                 '  [ "$code" = 124 ] && { echo "nvidia-smi did not answer within $NVIDIA_SMI_TIMEOUT s" >&2; exit 94; }\n' \
                 '  [ "$code" = 0 ] || { echo "nvidia-smi failed (exit code $code)" >&2; exit 94; }\n' \
                 'fi\n'
        script = f"NVIDIA_SMI_TIMEOUT={NVIDIA_SMI_TIMEOUT}\n" + ACCOUNT + script
        code, out, err = execute(client, sh(script, host.setup or ":", host.work_dir, str(MIN_FREE_KB),
                                            NVIDIA_SMI_MARK, *gpus.inventory_argv()),
                                 timeout=max(timeout, 90))
    except (OSError, EOFError, paramiko.SSHException) as exc:
        # The host went away while it was being checked (the session closed under it).
        raise InstanceError(f"{host.where()}: the connection broke during the check: "
                            f"{exc or type(exc).__name__}") from None
    finally:
        client.close()
    said = out.partition(NVIDIA_SMI_MARK + "\n")[2] if NVIDIA_SMI_MARK in out else ""
    if code == 94:
        raise InstanceError(f"{host.where()}: {err.strip()}: {' '.join(said.split())[:300] or 'no output'}")
    if code != 0:
        detail = (err or out).strip().splitlines()[-1:] or [f"exit code {code}"]
        what = {90: "the setup line failed", 92: f"cannot make the work directory {host.work_dir}",
                93: "no room for jobs"}.get(code, f"{probe} failed")
        if "not found" in (err + out) and code == 91:
            what = "horovodrun is not on the PATH of the login shell (or the setup line)"
        raise InstanceError(f"{host.where()}: {what}: {detail[0]}")
    lacks = build_lacks(out.partition(NVIDIA_SMI_MARK)[0]) if build else []
    if lacks:
        raise InstanceError(f"{host.where()}: {HOROVOD_BUILD_PROBE}: Horovod is built without {' and without '.join(lacks)}")
    isolation = re.search(r"^ISOLATION (\S+)$", out, re.M)
    isolation = isolation.group(1) if isolation else "shared"
    if NVIDIA_SMI_MARK not in out:
        return seen, None, isolation
    try:
        return seen, gpus.parse_inventory(said), isolation
    except gpus.GpuQueryError as exc:
        raise InstanceError(f"{host.where()}: {exc}") from None


class PolledOutput:
    """A reader the caller polls: read again a poll interval after a read that found nothing."""

    status_every = POLLED_STATUS_SECONDS

    def waiting(self, seconds):
        return Waiting(seconds=seconds)


class SftpOutput(PolledOutput):
    """Reads a job's output.log over SFTP (one open file, read where the follower is)."""

    def __init__(self, client, directory, timeout):
        self.sftp = client.open_sftp()
        self.sftp.get_channel().settimeout(timeout)
        self.path, self.handle = f"{directory}/output.log", None

    def read(self, offset, size, final=False):
        """Up to `size` bytes from `offset`; FileNotFoundError while there is no output.log."""
        if self.handle is None:
            self.handle = self.sftp.open(self.path, "rb")
        self.handle.seek(offset)
        return self.handle.read(size)

    def close(self):
        for closable in (self.handle, self.sftp):
            try:
                closable and closable.close()
            except Exception:
                pass


class ExecOutput(PolledOutput):
    """Reads output.log over exec (tail | head), for an sshd without an SFTP subsystem."""

    def __init__(self, client, directory, timeout):
        self.client, self.directory, self.timeout = client, directory, timeout

    def read(self, offset, size, final=False):
        code, out, err = execute(self.client, sh(READ, self.directory, str(offset + 1), str(size)),
                                 timeout=self.timeout, decode=False)
        if code == 44:
            raise FileNotFoundError(f"{self.directory}/output.log")
        if code != 0:
            raise InstanceError(f"cannot read {self.directory}/output.log: {err.strip() or f'exit code {code}'}")
        return out

    def close(self):
        pass


class StreamOutput:
    """Reads output.log through one long-lived exec channel (STREAM: `tail -f` from the byte
    offset, ending with the job's launcher): a write reaches the follower as it happens, where
    polling finds it up to a poll interval later, and a quiet job costs no reads. On a host whose
    tail cannot follow a process, reads by polling instead (`polling()`)."""

    def __init__(self, client, directory, timeout, wait, polling):
        self.client, self.directory, self.timeout, self.wait = client, directory, timeout, wait
        self.channel, self.at, self.reopen_at, self.ended = None, None, 0.0, False
        self._polling, self.polling = polling, None

    def waiting(self, seconds):
        """Until the stream has more (its channel's descriptor is readable), or `seconds`."""
        if self.polling is not None:
            return self.polling.waiting(min(seconds, self.wait))
        if self.channel is None:
            return Waiting(seconds=min(seconds, self.wait))
        return Waiting(seconds=seconds, fd=self.channel.fileno())

    @property
    def status_every(self):
        """How often the caller asks whether the launcher lives while no output comes: at once
        when the stream ended (the launcher is gone), else now and then, to notice a host gone
        silent."""
        if self.polling is not None:
            return self.polling.status_every
        return 0.0 if self.ended else STREAMED_STATUS_SECONDS

    def read(self, offset, size, final=False):
        """Up to `size` bytes from `offset`, b"" if none has come (`final`: the launcher has
        ended, wait for the stream's end) or the stream ended (it reopens on the next read);
        FileNotFoundError while there is no output.log. Only a final read waits."""
        if self.polling is not None:
            return self.polling.read(offset, size)
        if self.channel is None or self.at != offset:
            self._open(offset)
        try:
            self.channel.settimeout(self.timeout if final else 0.0)
            data = self.channel.recv(size)
        except socket.timeout:
            if final:
                raise InstanceError(f"no end of {self.directory}/output.log within {self.timeout:.0f} s") from None
            return b""
        if data:
            self.at += len(data)
            return data
        code, err = self._ended()
        if code == 44:
            raise FileNotFoundError(f"{self.directory}/output.log")
        if code == 45:
            self.polling = self._polling()
            return self.polling.read(offset, size)
        if code != 0:
            raise InstanceError(f"cannot read {self.directory}/output.log: {err or f'exit code {code}'}")
        self.ended = True
        return b""

    def _open(self, offset):
        self._close_channel()
        pause = self.reopen_at - time.monotonic()
        if pause > 0:                # the stream just ended: do not spin reopening it
            time.sleep(pause)
        channel = self.client.get_transport().open_session(timeout=self.timeout)
        channel.exec_command(sh(STREAM, self.directory, str(offset + 1)))
        channel.shutdown_write()
        self.channel, self.at, self.ended = channel, offset, False

    def _ended(self):
        """The exit code and stderr of the stream that just reached its end."""
        channel, self.channel = self.channel, None
        self.reopen_at = time.monotonic() + self.wait
        try:
            deadline = time.monotonic() + self.timeout
            while not channel.exit_status_ready():
                transport = self.client.get_transport()
                if transport is None or not transport.is_active() or time.monotonic() > deadline:
                    raise InstanceError("the connection to the host dropped")
                channel.status_event.wait(0.1)
            err = channel.recv_stderr(4096) if channel.recv_stderr_ready() else b""
            return channel.recv_exit_status(), err.decode(errors="replace").strip()
        finally:
            channel.close()

    def _close_channel(self):
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def close(self):
        self._close_channel()
        if self.polling is not None:
            self.polling.close()


def send_file(client, source, path, timeout):
    """Copy the open local file `source` to `path` on the host: over SFTP, or through `cat` where
    the server offers no SFTP."""
    try:
        sftp = client.open_sftp()
    except paramiko.SSHException:          # "subsystem request failed": no SFTP on this sshd
        if not client.get_transport() or not client.get_transport().is_active():
            raise
        code, out, err = execute(client, sh('cat > "$1"', path), stdin=source, timeout=timeout)
        if code != 0:
            raise InstanceError(f"cannot write {path}: {(err or out).strip() or f'exit code {code}'}")
        return
    try:
        sftp.get_channel().settimeout(timeout)
        sftp.putfo(source, path, confirm=True)
    finally:
        sftp.close()


def open_output(client, directory, timeout, wait=None):
    """A reader of the job's output.log: a stream where `wait` is given (a follow waits on its
    channel, and polls at most `wait` seconds apart where the host cannot stream); else polling
    reads (SFTP where the server offers it, else exec)."""
    if wait is not None:
        return StreamOutput(client, directory, timeout, wait, lambda: open_output(client, directory, timeout))
    try:
        return SftpOutput(client, directory, timeout)
    except paramiko.SSHException:          # "subsystem request failed": no SFTP on this sshd
        if not client.get_transport() or not client.get_transport().is_active():
            raise
        return ExecOutput(client, directory, timeout)


def job_env_file(variables):
    """ENV_FILE's text for the job's own `variables`: a line for the job's shell that puts
    NAME=value words, each quoted, before the rank's command in "$@" (JOB_SHELL's `env` sets
    them). Whatever a value holds (quotes, `$(...)`, newlines, a leading '-'), it is one word."""
    for name, value in variables.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or "\0" in value:
            raise ValueError(f"{name!r} cannot be passed as an environment variable")
    words = " ".join(shlex.quote(f"{name}={value}") for name, value in variables.items())
    return f'set -- {words} "$@"\n'.encode()


def first_uid(name):
    """The first uid PREPARE tries for job `name` (unique per installation and job), from the
    range the portal's own machine gives its jobs."""
    return UID_BASE + zlib.crc32(name.encode()) % UID_SPAN


def run_as(hosts, users):
    """How the job runs on `hosts`, from PREPARE's words for each: "as uid N on a, b; under the
    SSH account on c"."""
    uids = [f"{h.name} as uid {word.split()[1]}" for h, word in zip(hosts, users) if word.startswith("uid ")]
    shared = [h.name for h, word in zip(hosts, users) if not word.startswith("uid ")]
    parts = ([f"on {', '.join(uids)}"] if uids else []) + \
            ([f"on {', '.join(shared)} under the SSH account, as its other jobs"] if shared else [])
    return "; ".join(parts)


class SSHRunner(Runner):
    """Runs a job on `hosts` (the first one runs horovodrun). Records host keys it learns in
    `learned_host_keys` ({instance name: key line}) for the caller to store."""

    name = "instances"

    def __init__(self, hosts, start_timeout=60, poll_interval=0.2, connect_timeout=10.0, kill_grace=10,
                 lost_after=300.0):
        if not hosts:
            raise ValueError("an SSH job needs at least one host")
        self.hosts = list(hosts)
        self.start_timeout = start_timeout
        self.poll_interval = poll_interval
        self.connect_timeout = connect_timeout
        self.kill_grace = kill_grace
        self.lost_after = lost_after
        self.learned_host_keys = {}

    @property
    def first(self):
        return self.hosts[0]

    def _connect(self, host):
        client, seen = connect(host, self.connect_timeout)
        if not host.host_key:
            self.learned_host_keys[host.name] = seen
        return client

    def host_names(self, spec=None):
        """The hosts as horovodrun's -H names them (and HOROVOD_HOSTNAME tells each rank). An
        elastic job's hosts may change, so they are always named by address."""
        if len(self.hosts) == 1 and not (spec and spec.elastic):
            # One host: horovodrun starts every rank locally, no SSH between hosts needed.
            return ["localhost"]
        return [h.address for h in self.hosts]

    def host_list(self, spec):
        if len(self.hosts) == 1 and not spec.elastic:
            return f"localhost:{spec.gpus}"
        return ",".join(f"{name}:{h.slots}" for name, h in zip(self.host_names(spec), self.hosts))

    def placement(self, spec, forward=()):
        first = self.first
        return Placement(
            hosts=tuple((name, h.address, h.slots if len(self.hosts) > 1 or spec.elastic else spec.gpus)
                        for name, h in zip(self.host_names(spec), self.hosts)),
            start_timeout=self.start_timeout, ssh_port=first.peer_ssh_port, ssh_key=first.peer_ssh_key,
            network_interface=first.network_interface, wrapper=(f"./{RANK_WRAPPER}",), forward=tuple(forward))

    def command(self, spec):
        """The launcher's argv on the first host, and the files it needs in the control folder."""
        forward = (*self.environment(spec), JOB_DIR_VAR, OUTPUT_DIR_VAR)     # LAUNCH sets the job's folders
        return launchers.of(spec.launcher).over_ssh(spec, self.placement(spec, forward))

    def environment(self, spec):
        """The portal's variables, which every process of the job gets (its launcher, which runs
        as the account, too) on top of the instance's own login environment. Never the job's own
        (job_variables)."""
        env = dict(spec.gpu_env(self.host_names(spec)))
        env.update(launchers.of(spec.launcher).environment(spec))
        env.update({"PYTHONUNBUFFERED": "1", JOB_ID_VAR: str(spec.job_id), HOST_NAME_VAR: self.host_names(spec)[0]})
        return env

    def job_variables(self, spec):
        """The variables the job asked for that the portal does not set itself: its own processes
        alone get them (ENV_FILE)."""
        portal = {*self.environment(spec), JOB_DIR_VAR, OUTPUT_DIR_VAR, CHECKPOINT_VAR}
        return {name: value for name, value in spec.env.items() if name not in portal}

    def _prepare(self, host, spec):
        """The job's folders on `host` (PREPARE) and its files: the rank wrapper in the control
        folder, the script or the project, the rank launcher and its argv (and a rerun's
        checkpoint) in the job's own. Returns PREPARE's word for how the job runs there ("uid N"
        or "shared")."""
        client = self._connect(host)
        try:
            code, out, err = execute(client, sh(PREPARE, host.work_dir, spec.name, str(MIN_FREE_KB),
                                                str(first_uid(spec.name)), host.setup, spec.python))
            if code != 0:
                raise InstanceError(f"{host.where()}: cannot make the job directory {host.job_dir(spec)}: "
                                    f"{(err or out).strip() or f'exit code {code}'}")
            if spec.project is not None:
                self._put_project(client, host, spec)
            if spec.checkpoint is not None:
                self._put_checkpoint(client, host, spec)
        finally:
            client.close()
        files = {name: (JOB_PYTHON / name).read_bytes() for name in ("ringmaster_metrics.py", "ringmaster_rank.py")}
        if spec.script_content is not None:
            files[spec.script_name] = spec.script_content.encode()
        name, content = spec.argv_file()
        files[name] = content
        files[ENV_FILE] = job_env_file(self.job_variables(spec))
        control = {RANK_WRAPPER: RANK_WRAPPER_TEXT.encode()}
        if limits.prlimit_argv(spec):
            control[LIMITS_FILE] = " ".join(limits.prlimit_argv(spec)).encode()
        self._write(host, spec, control, control=True)
        self._write(host, spec, files)
        return out.strip().splitlines()[-1] if out.strip() else ""

    def _put_project(self, client, host, spec):
        """Unpack the job's project in its folder on `host`, as the job, once (INSTALL_PROJECT)."""
        code, out, err = execute(client, sh(INSTALL_PROJECT, host.control_dir(spec)), stdin=spec.project,
                                 timeout=max(60.0, len(spec.project) / COPY_BYTES_PER_SECOND))
        if code != 0:
            raise InstanceError(f"{host.where()}: cannot put the project in {host.job_dir(spec)}/{PROJECT_DIR}: "
                                f"{(err or out).strip() or f'exit code {code}'}")

    def _put_checkpoint(self, client, host, spec):
        """Put a rerun's checkpoint (spec.checkpoint, a file on this machine) in the job's folder
        on `host`, once: a retried launch finds it there (HAS_CHECKPOINT) and sends nothing."""
        control = host.control_dir(spec)
        _, out, _ = execute(client, sh(HAS_CHECKPOINT, control))
        if out.strip() == "installed":
            return
        root, name = spec.checkpoint
        try:
            source = open_artifact(root, name)
        except FileNotFoundError:
            raise FileNotFoundError(f"the checkpoint {name} this job starts from is gone "
                                    f"(deleted since, or never kept)") from None
        sent = f".checkpoint.{secrets.token_hex(8)}.part"     # this launch's own: another may run at once
        with source:
            size = os.fstat(source.fileno()).st_size
            send_file(client, source, f"{control}/{sent}", max(self.connect_timeout, 30))
        # The copy into the job's folder takes a while for a large file: no output comes meanwhile.
        code, out, err = execute(client, sh(INSTALL_CHECKPOINT, control, sent, spec.checkpoint_file),
                                 timeout=max(60.0, size / COPY_BYTES_PER_SECOND))
        if code != 0:
            raise InstanceError(f"{host.where()}: cannot put the checkpoint {name} in {host.job_dir(spec)}: "
                                f"{(err or out).strip() or f'exit code {code}'}")

    def _write(self, host, spec, files, control=False):
        """Write {name: bytes} into the job's folder on `host` (as the job), or its control
        folder (as the account), each atomically."""
        client = self._connect(host)
        try:
            for name, content in files.items():
                code, out, err = execute(client, sh(UPLOAD_CONTROL if control else UPLOAD_JOB,
                                                    host.control_dir(spec), name), stdin=content)
                if code != 0:
                    raise InstanceError(f"{host.where()}: cannot write {name}: "
                                        f"{(err or out).strip() or f'exit code {code}'}")
        finally:
            client.close()

    def resize(self, spec):
        """The job's hosts are this runner's now: each gets the job's folders (a new one its files
        and the launcher's), the first the hosts file (what horovodrun's discovery script prints,
        what torchrun_agents keeps an agent per GPU of), and all the GPU map."""
        _, files = self.command(spec)
        for host in self.hosts[1:]:
            self._prepare(host, spec)
            self._write(host, spec, files, control=True)
        self._publish_hosts(spec)

    def _publish_hosts(self, spec):
        names = self.host_names(spec)
        hosts = "".join(f"{name}:{h.slots}\n" for name, h in zip(names, self.hosts)).encode()
        self._write(self.first, spec, {HOSTS_FILE: hosts}, control=True)
        if spec.bound:
            for host in self.hosts:
                self._write(host, spec, {GPU_MAP_FILE: (spec.gpu_map(names) + "\n").encode()})

    def launch(self, spec):
        users = [self._prepare(host, spec) for host in self.hosts]
        argv, files = self.command(spec)
        for host in self.hosts:
            self._write(host, spec, files, control=True)
        if spec.elastic:
            self._write(self.first, spec, {DISCOVERY_SCRIPT: DISCOVERY_SCRIPT_TEXT.encode()}, control=True)
            self._publish_hosts(spec)
        program = launchers.of(spec.launcher).PROGRAM
        client = self._connect(self.first)
        try:
            env_words = [f"{k}={v}" for k, v in self.environment(spec).items()]
            code, out, err = execute(client, sh(LAUNCH, self.first.control_dir(spec), self.first.setup,
                                                *env_words, *argv))
        finally:
            client.close()
        if code != 0:
            raise InstanceError(f"{self.first.where()}: cannot start {program}: "
                                f"{(err or out).strip() or f'exit code {code}'}")
        status = out.strip().splitlines()[-1] if out.strip() else ""
        placement = self.host_list(spec)
        if status.startswith("already"):
            return Started(f"{program} already started on {self.first.name} (pid {status.split()[-1]})", True)
        if status == "setup-failed":
            return Started(f"the setup line of {self.first.name} failed (see the log)")
        names = ", ".join(f"{h.name}:{h.slots}" for h in self.hosts)
        where = f"elastic, {spec.min_gpus} to {spec.max_gpus} processes" if spec.elastic else f"-H {placement}"
        return Started(f"{program} started on {self.first.name} (pid {status.split()[-1]}) with {spec.gpus} "
                       f"processes on {names} ({where}); {run_as(self.hosts, users)}")

    def follow(self, spec, offset, cursor=None):
        """Stream output.log on the first host from `offset` (polling it by SFTP or exec where
        the host cannot stream), then Exited. Trouble reaching the host that lasts is said
        (Status) and, after `lost_after` seconds, ends the follow."""
        host = self.first
        directory = host.control_dir(spec)
        client = reader = None
        trouble_since = None
        said_trouble = False
        last_status = -1e9
        try:
            while True:
                try:
                    if client is None:
                        client = self._connect(host)
                        reader = open_output(client, directory, max(self.connect_timeout, 30), self.poll_interval)
                    try:
                        data = reader.read(offset, READ_CHUNK)
                    except FileNotFoundError:
                        code, out, _ = execute(client, sh(STATUS, directory))
                        if out.strip() in ("missing", "gone"):
                            yield Exited(None, f"the job was never started on {host.name}")
                            return
                        yield Waiting(seconds=self.poll_interval)
                        continue
                    trouble_since = None
                    if said_trouble:
                        said_trouble = False
                        yield Status(f"reading the job's output on {host.name} again")
                    if data:
                        yield Output(data, offset)
                        offset += len(data)
                        continue
                    now = time.monotonic()
                    if now - last_status < reader.status_every:
                        yield reader.waiting(max(self.poll_interval, last_status + reader.status_every - now))
                        continue
                    last_status = now
                    code, out, _ = execute(client, sh(STATUS, directory))
                    status = out.strip()
                    if status == "alive":
                        yield reader.waiting(max(self.poll_interval, reader.status_every))
                        continue
                    # Ended: the exit code is written after the last output, so drain once more.
                    rest = reader.read(offset, READ_CHUNK, final=True)
                    if rest:
                        yield Output(rest, offset)
                        offset += len(rest)
                        continue
                    if status.startswith("exit "):
                        code = int(status.split()[1])
                        yield Exited(code, f"{launchers.of(spec.launcher).PROGRAM} exited with code {code}",
                                     rlimits=limits.held(spec) if status.endswith(" limited") else ())
                    else:
                        yield Exited(None, f"{launchers.of(spec.launcher).PROGRAM} stopped on {host.name} "
                                           f"without reporting an exit code")
                    return
                except (InstanceError, OSError, EOFError, paramiko.SSHException) as exc:
                    # The connection dropped or the host is away: keep trying for a while.
                    for closable in (reader, client):
                        try:
                            closable and closable.close()
                        except Exception:
                            pass
                    client = reader = None
                    now = time.monotonic()
                    trouble_since = trouble_since or now
                    if now - trouble_since > self.lost_after:
                        yield Exited(None, f"lost contact with {host.name} for {self.lost_after:.0f} s: {exc}")
                        return
                    if now - trouble_since >= TROUBLE_SAID_AFTER and not said_trouble:
                        said_trouble = True
                        yield Status(f"cannot read the job's output on {host.name} since "
                                     f"{now - trouble_since:.0f} s ({exc or type(exc).__name__}); retrying, "
                                     f"and failing the job after {self.lost_after:.0f} s")
                    yield Waiting(seconds=min(2.0, self.poll_interval * 10))
        finally:
            for closable in (reader, client):
                try:
                    closable and closable.close()
                except Exception:
                    pass

    def fetch_artifacts(self, spec, target, room=None):
        """Bring the job's artifacts (its output folder on the first host) into the local folder
        `target` over SFTP, at most `room` bytes (None: no limit). Returns (bytes kept, why not
        all were brought or ""). A file already there with the same size and time is not read
        again. Only regular files owned by whoever owns the output folder are read, each checked
        once opened against what the listing said: a link the job planted never reaches another
        file of the account's. The folder is walked within runners.artifacts' limits, as a local
        one is; what is left out (too deep, too many, unreadable) is named in the note."""
        client = self._connect(self.first)
        try:
            sftp = client.open_sftp()
            sftp.get_channel().settimeout(max(self.connect_timeout, 30))
            try:
                return _fetch_tree(sftp, f"{self.first.job_dir(spec)}/{OUTPUT_DIR}", Path(target), room)
            finally:
                sftp.close()
        finally:
            client.close()

    def system_probe(self, spec):
        return SSHProbe(self, spec)

    def cancel(self, spec):
        """Kill the job's processes on every host (process group, then the marker), in parallel."""
        errors = []

        def stop(host):
            try:
                client = self._connect(host)
                try:
                    code, out, err = execute(client, sh_as_root(host.control_dir(spec), CANCEL, host.control_dir(spec),
                                                                        str(self.kill_grace)),
                                             timeout=self.kill_grace + 60)
                finally:
                    client.close()
                if code != 0:
                    errors.append(f"{host.where()}: {(err or out).strip()}")
            except InstanceError as exc:
                errors.append(str(exc))

        threads = [threading.Thread(target=stop, args=(host,)) for host in self.hosts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise InstanceError("; ".join(errors))


def _fetch_tree(sftp, remote, target, room):
    try:
        top = sftp.lstat(remote)
    except FileNotFoundError:
        return 0, ""
    if not stat.S_ISDIR(top.st_mode):
        return 0, f"{remote} is not a folder"
    files, skipped = _list_remote(sftp, remote, top.st_uid)
    kept = 0
    for name, attrs in sorted(files, key=lambda item: item[0]):
        if room is not None and kept + attrs.st_size > room:
            return kept, (f"stopped at {name}: the job's artifacts need more than the {room} bytes left "
                          f"in its owner's storage quota")
        try:
            local = target.joinpath(*name.split("/"))
            seen = local.stat() if local.is_file() else None
            if seen is None or (seen.st_size, int(seen.st_mtime)) != (attrs.st_size, attrs.st_mtime):
                local.parent.mkdir(parents=True, exist_ok=True)
                if not _download(sftp, f"{remote}/{name}", attrs, local):
                    continue
        except OSError as exc:      # e.g. a path too long for one call, there or here
            skipped.append(Skipped(name, attrs.st_mtime or 0, f"cannot be brought back: {exc.strerror or exc}"))
            continue
        kept += attrs.st_size
    if not skipped:
        return kept, ""
    return kept, "not brought back: " + "; ".join(f"{item.reason}: {item.name or 'the output folder'}"
                                                  for item in skipped)


def _list_remote(sftp, remote, owner):
    """([(name, SFTPAttributes)] of the regular files under `remote` owned by `owner`, [Skipped]):
    walked with a loop, within runners.artifacts' MAX_DEPTH and MAX_ENTRIES, as a local folder is."""
    files, skipped, seen = [], [], 0
    folders = [("", 0)]                 # (name + "/", depth) of the folders still to read
    while folders:
        prefix, depth = folders.pop()
        try:
            listed = sftp.listdir_attr(f"{remote}/{prefix}" if prefix else remote)
        except OSError as exc:
            skipped.append(Skipped(prefix, 0, f"cannot be read: {exc.strerror or exc}"))
            continue
        for attrs in listed:
            if attrs.filename in (".", ".."):
                continue
            if seen >= MAX_ENTRIES:
                skipped.append(Skipped(prefix, 0, too_many()))
                return files, skipped
            seen += 1
            name = prefix + attrs.filename
            if attrs.st_uid != owner:
                continue
            if stat.S_ISREG(attrs.st_mode):
                files.append((name, attrs))
            elif stat.S_ISDIR(attrs.st_mode):
                if depth >= MAX_DEPTH:
                    skipped.append(Skipped(name + "/", attrs.st_mtime or 0, too_deep()))
                else:
                    folders.append((name + "/", depth + 1))
    return files, skipped


def _download(sftp, path, attrs, local):
    """Copy one remote file, if what is opened is still the file listed; False if not."""
    partial = local.with_name(f".{local.name}.part")
    with sftp.open(path, "rb") as source:
        opened = source.stat()
        if (opened.st_uid, opened.st_mode, opened.st_size) != (attrs.st_uid, attrs.st_mode, attrs.st_size):
            return False
        source.prefetch(attrs.st_size)
        with open(partial, "wb") as out:
            left = attrs.st_size
            while left > 0:
                chunk = source.read(min(left, READ_CHUNK))
                if not chunk:
                    break
                out.write(chunk)
                left -= len(chunk)
    os.utime(partial, (attrs.st_atime or attrs.st_mtime, attrs.st_mtime))
    partial.replace(local)
    return True


class SSHProbe:
    """The job's hosts, each over an SSH connection of its own that lives as long as the job's
    follower: its GPUs (nvidia-smi, the job's indices only) or its processes' CPU and memory."""

    def __init__(self, runner, spec):
        self.runner, self.spec = runner, spec
        self.clients = {}
        self.rate = telemetry.CpuRate()

    def _sample_host(self, position, host):
        client = self.clients.get(host.name)
        if client is None:
            client = self.clients[host.name] = self.runner._connect(host)
        indices = self.spec.gpu_binding[position] if position < len(self.spec.gpu_binding) else ()
        argv = gpus.sample_argv(indices) if indices else []
        control = host.control_dir(self.spec)
        code, out, err = execute(client, sh_as_root(control, SAMPLE, host.setup or ":", control, *argv), timeout=30)
        if code != 0:
            raise gpus.GpuQueryError(f"{host.where()}: nvidia-smi failed: {(err or out).strip()[:300]}")
        if indices:
            return telemetry.gpu_samples(host.name, gpus.parse_samples(out))
        words = out.split()
        if len(words) != 5 or words[0] != "CPU":
            return []
        ticks, hz, rss_kib, total_kib = (float(w) for w in words[1:])
        return [telemetry.Sample(host.name, "cpu", self.rate.percent(host.name, ticks / (hz or 100)),
                                 rss_kib / 1024, total_kib / 1024)]

    def sample(self):
        samples, errors = [], []
        for position, host in enumerate(self.runner.hosts):
            try:
                samples += self._sample_host(position, host)
            except (InstanceError, gpus.GpuQueryError, OSError, EOFError, paramiko.SSHException) as exc:
                errors.append(str(exc))
                client = self.clients.pop(host.name, None)
                if client is not None:
                    client.close()
        if errors and not samples:
            raise gpus.GpuQueryError("; ".join(errors))
        return samples

    def close(self):
        for client in self.clients.values():
            client.close()
        self.clients = {}
