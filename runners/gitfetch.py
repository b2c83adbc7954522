"""A project from a git repository: one commit's files as a tar.gz, fetched by the portal (never
by the job) with the `git` command line.

What the user gives, a URL and a ref, is untrusted, and none of it reaches an option parser or
a shell: the URL is taken only with a scheme the caller allows (https and ssh on a portal;
never file://, ext:: or a local path), the ref only as a branch, tag or full commit name that
`git check-ref-format` accepts, and both only after `--`. git runs with a fixed environment (no
system or user configuration, no terminal prompt, no proxy, only the allowed transports) in a
temporary folder that is removed after, under a time limit and a limit on the bytes it writes
(RLIMIT_FSIZE), and connects only to the address the caller checked (`address`): libcurl's
resolve entry for http(s), ssh's HostName for ssh, the address itself for git://. HTTP
redirects are not followed. A token for https is given to git through its environment
(GIT_CONFIG_*), never in its arguments, and never appears in what this module returns or raises;
an SSH key is written for the one fetch (0600) into the temporary folder.

The fetch is shallow (one commit, no tags); `git archive` then writes the commit's tree, which
the caller reads as an untrusted archive (runners.projects.read_archive).
"""
import base64
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

SCHEMES = ("https", "ssh")        # a portal's default; tests add git:// on loopback
MAX_URL_CHARS = 2048
MAX_REF_CHARS = 255
FULL_COMMIT = re.compile(r"[0-9a-f]{40}\Z|[0-9a-f]{64}\Z")
HOST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?\Z")
REF_CHARS = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/-]*\Z")
DEFAULT_PORTS = {"https": 443, "http": 80, "ssh": 22, "git": 9418}
TOKEN_USER = "x-access-token"
NO_GIT = "This portal cannot fetch git repositories: git is not installed."
# What git says of a ref the repository does not have.
MISSING = ("couldn't find remote ref", "not our ref", "unadvertised object", "no such ref")
# git's words after a failed ssh connection, which say nothing of why.
GENERIC = ("Could not read from remote repository", "Please make sure you have the correct access rights",
           "and the repository exists")
# What git says where the server wants credentials it was not given, or refused them.
DENIED = ("could not read username", "authentication failed", "terminal prompts disabled", "permission denied")


class BadGit(ValueError):
    """What is wrong with a git URL, a ref, or the fetch, in words for the user."""


class MissingRef(BadGit):
    """The repository has no such branch, tag or commit."""


@dataclass(frozen=True)
class Url:
    text: str            # as given
    scheme: str
    host: str            # without brackets
    port: int


@dataclass(frozen=True)
class Fetched:
    commit: str
    archive: bytes       # the commit's files, a tar.gz (git archive)


def parse_url(text, schemes=SCHEMES):
    """`text` as a Url, or BadGit saying why it is not one the portal fetches from."""
    if not isinstance(text, str) or not text:
        raise BadGit("Give the repository's URL, e.g. https://github.com/org/repo.git.")
    if len(text) > MAX_URL_CHARS:
        raise BadGit(f"The URL is longer than {MAX_URL_CHARS} characters.")
    if text.startswith("-") or any(ord(c) < 0x21 or ord(c) == 0x7f for c in text):
        raise BadGit("The URL may not start with '-' nor hold spaces or control characters.")
    allowed = " or ".join(f"{scheme}://" for scheme in schemes)
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise BadGit(f"Not a URL: {exc}.") from None
    scheme = parts.scheme.lower()
    if "://" not in text or scheme not in schemes:
        raise BadGit(f"The URL must start with {allowed} (e.g. ssh://git@host/org/repo.git rather than "
                     f"git@host:org/repo.git); {text.split(':', 1)[0]!r} is not fetched from.")
    if parts.password is not None or (parts.username is not None and scheme != "ssh"):
        raise BadGit("Put no user name or password in the URL (it is kept with the job): give a token as "
                     "git.token.")
    if parts.username is not None and not re.fullmatch(r"[A-Za-z0-9._-]+", parts.username):
        raise BadGit("The URL's user name may hold only letters, digits, '.', '_' and '-'.")
    host = parts.hostname or ""
    if not host or not (HOST_NAME.match(host) or (":" in host and re.fullmatch(r"[0-9a-fA-F:.]+", host))):
        raise BadGit("The URL names no host, or one with characters a host name does not have.")
    if parts.fragment or parts.query:
        raise BadGit("The URL may not have a query or a fragment (# or ?).")
    if parts.path in ("", "/"):
        raise BadGit("The URL names no repository (its path is empty).")
    return Url(text, scheme, host.lower(), port or DEFAULT_PORTS[scheme])


def check_ref(ref):
    """`ref` (a branch, a tag, or a full commit id) if git may be asked for it; else BadGit."""
    if not isinstance(ref, str) or not ref:
        raise BadGit("Give a ref: a branch, a tag or a full commit id.")
    good = len(ref) <= MAX_REF_CHARS and REF_CHARS.match(ref) and ".." not in ref and "//" not in ref \
        and "/." not in ref and not ref.endswith((".", "/", ".lock"))
    if good and not FULL_COMMIT.match(ref):
        if shutil.which("git") is None:
            raise BadGit(NO_GIT)
        good = subprocess.run(["git", "check-ref-format", "--allow-onelevel", ref], env=_environment("/"),
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=10).returncode == 0
    if not good:
        raise BadGit(f"{ref[:100]!r} is not a branch, tag or commit name git takes.")
    return ref


def fetch(url, ref, *, address, timeout, max_bytes, schemes=SCHEMES, token=None, ssh_key=None, known_hosts=None):
    """The commit that `ref` names in the repository at `url` (parse_url's, checked), and its
    files as a tar.gz. `address`: the one address (text) to connect to, checked by the caller;
    `timeout`: seconds for everything; `max_bytes`: the most any one file git writes may hold
    (the fetched pack, the archive); `token`: for https, sent as the password of
    x-access-token; `ssh_key`: for ssh, a private key (OpenSSH's format) to log in with, written
    for this fetch only (0600, in its temporary folder); `known_hosts`: the ssh host keys a host
    must match. MissingRef where the repository has no such ref; BadGit for anything else that
    failed."""
    if shutil.which("git") is None:
        raise BadGit(NO_GIT)
    deadline = time.monotonic() + timeout
    with tempfile.TemporaryDirectory(prefix="ringmaster-git-") as home:
        env = _environment(home, schemes)
        target = url.text
        if url.scheme in ("https", "http"):
            if ssh_key:
                raise BadGit("An SSH key is for ssh:// URLs.")
            if url.host != address:          # a name: libcurl connects to the address it was checked at
                _config(env, "http.curloptResolve", f"{url.host}:{url.port}:{_bracketed(address)}")
            _config(env, "http.followRedirects", "false")
            _config(env, "http.lowSpeedLimit", "1000")
            _config(env, "http.lowSpeedTime", str(max(5, int(timeout))))
            if token:
                basic = base64.b64encode(f"{TOKEN_USER}:{token}".encode()).decode()
                _config(env, "http.extraHeader", f"Authorization: Basic {basic}")
        elif url.scheme == "ssh":
            if token:
                raise BadGit("A token is for https URLs; an ssh URL takes none.")
            identity = ["-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none"]
            if ssh_key:
                key_file = os.path.join(home, "key")
                with os.fdopen(os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
                    out.write(ssh_key.strip() + "\n")
                identity += ["-i", key_file]
            env["GIT_SSH_VARIANT"] = "ssh"
            env["GIT_SSH_COMMAND"] = shlex.join([
                "ssh", "-F", "/dev/null", *identity, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={known_hosts or '/dev/null'}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", f"HostKeyAlias={_known_as(url)}", "-o", f"HostName={address}", "-o", "CheckHostIP=no",
                "-o", f"ConnectTimeout={max(1, int(timeout))}"])
        elif url.scheme == "git":
            if token or ssh_key:
                raise BadGit("A token is for https URLs, an SSH key for ssh:// URLs.")
            target = urlsplit(url.text)._replace(netloc=f"{_bracketed(address)}:{url.port}").geturl()
        repo = os.path.join(home, "repo")
        # No template (no sample hooks); the fetched objects kept as one pack, one file under the limit.
        _config(env, "transfer.unpackLimit", "1")
        _git(["init", "--quiet", "--bare", "--template=", repo], home, env, deadline, max_bytes)
        done = _git(["fetch", "--quiet", "--depth=1", "--no-tags", "--no-recurse-submodules", "--", target, ref],
                    repo, env, deadline, max_bytes)
        if done.returncode != 0:
            said = _said(done.stderr, token)
            if any(words in said.lower() for words in MISSING):
                raise MissingRef(f"The repository has no branch, tag or commit {ref!r}.")
            if any(words in said.lower() for words in DENIED):
                raise BadGit(f"{url.text} refused the fetch: a private repository needs a credential that may "
                             f"read it (git.credential; or git.token for https). git said: {said}")
            raise BadGit(f"git could not fetch {ref!r} from {url.text}: {said or f'exit {done.returncode}'}")
        commit = _git(["rev-parse", "--verify", "--end-of-options", "FETCH_HEAD^{commit}"], repo, env, deadline,
                      max_bytes)
        if commit.returncode != 0:
            raise MissingRef(f"{ref!r} names no commit in the repository.")
        commit = commit.stdout.decode().strip()
        tarball = os.path.join(home, "project.tar.gz")
        made = _git(["archive", "--format=tar.gz", f"--output={tarball}", "--end-of-options", commit],
                    repo, env, deadline, max_bytes)
        if made.returncode != 0:
            raise BadGit(f"git could not write the files of {commit}: {_said(made.stderr, token)}")
        with open(tarball, "rb") as handle:
            return Fetched(commit, handle.read())


def _known_as(url):
    """The host's name in known_hosts, as ssh writes it there (ssh-keyscan too): host, or
    [host]:port for a port other than 22."""
    return url.host if url.port == 22 else f"[{url.host}]:{url.port}"


def _bracketed(address):
    return f"[{address}]" if ":" in address else address


def _environment(home, schemes=()):
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_ASKPASS": "/bin/false",
        "SSH_ASKPASS": "/bin/false", "GIT_ALLOW_PROTOCOL": ":".join(schemes) or "none", "GIT_PROTOCOL_FROM_USER": "0",
        "GIT_CONFIG_COUNT": "0",
    }


def _config(env, key, value):
    index = int(env["GIT_CONFIG_COUNT"])
    env[f"GIT_CONFIG_KEY_{index}"], env[f"GIT_CONFIG_VALUE_{index}"] = key, value
    env["GIT_CONFIG_COUNT"] = str(index + 1)


def _git(args, cwd, env, deadline, max_bytes):
    """git `args` in `cwd`: its exit status, output and errors; BadGit past the deadline or the
    byte limit. It runs in its own process group, all of which is ended on either."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise BadGit("Fetching the repository took too long.")
    command = ["prlimit", f"--fsize={int(max_bytes)}", "--", "git", *args] if shutil.which("prlimit") else \
        ["git", *args]
    process = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = process.communicate(timeout=left)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise BadGit("Fetching the repository took too long.") from None
    # A file stopped at the limit: git, or a process of its (index-pack), got SIGXFSZ.
    if process.returncode != 0 and (process.returncode in (-signal.SIGXFSZ, 128 + signal.SIGXFSZ)
                                    or _any_file_reached(cwd, max_bytes)):
        raise BadGit(f"The repository is larger than the {max_bytes:,} bytes taken.")
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def _any_file_reached(folder, size):
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                if os.lstat(os.path.join(root, name)).st_size >= size:
                    return True
            except OSError:
                continue
    return False


def _said(stderr, token):
    """git's last error lines, short, without the token."""
    lines = [line.strip() for line in stderr.decode(errors="replace").splitlines()
             if line.strip() and not any(words in line for words in GENERIC)]
    text = " ".join(lines[-2:])[:500]
    return text.replace(token, "***") if token else text
