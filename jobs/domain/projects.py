"""Projects a user uploads as an archive or names as a git repository at a ref: read as untrusted
(runners.projects; git's fetch: runners.gitfetch), kept once per owner by digest, and read back
file by file for the job page and the API."""
import threading

from cryptography.exceptions import UnsupportedAlgorithm
from django.conf import settings
from django.db import IntegrityError, transaction

from jobs import secrets
from jobs.domain import destinations, sourcecheck
from jobs.models import GitCredential, Project
from runners import gitfetch, packages, projects
from runners.gitfetch import BadGit  # noqa: F401  (callers catch it from here)
from runners.projects import BadProject  # noqa: F401  (callers catch it from here)

MB = 1 << 20
# Reports of (snapshot, entry point): the same files always give the same one, and a study or a
# rerun submits the same snapshot again and again.
_reports = {}
_reports_lock = threading.Lock()
REPORTS_KEPT = 64


def limits():
    """The site's limits on an uploaded archive (settings.RINGMASTER_PROJECT_*)."""
    return projects.Limits(archive_bytes=int(settings.RINGMASTER_PROJECT_MAX_ARCHIVE_MB * MB),
                           expanded_bytes=int(settings.RINGMASTER_PROJECT_MAX_EXPANDED_MB * MB),
                           files=settings.RINGMASTER_PROJECT_MAX_FILES)


def store(owner, data):
    """The owner's snapshot of the archive `data` (bytes): made, or the one already kept with the
    same files. BadProject says what is wrong with the archive; nothing is kept then."""
    files = projects.read_archive(data, limits())
    digest = projects.digest(files)
    try:
        with transaction.atomic():
            project, _ = Project.objects.get_or_create(owner=owner, sha256=digest, defaults={
                "files": len(files), "size": sum(len(file.content) for file in files),
                "listing": projects.listing(files), "archive": projects.pack(files)})
    except IntegrityError:      # the same files, twice at once
        project = Project.objects.get(owner=owner, sha256=digest)
    return project


def git_source(url, ref):
    """The repository's URL (parsed) and the ref, checked for what they are, before any fetch:
    a scheme the site takes (settings.RINGMASTER_GIT_SCHEMES), a ref git takes. BadGit if not."""
    return gitfetch.parse_url(url, tuple(settings.RINGMASTER_GIT_SCHEMES)), gitfetch.check_ref(ref)


def store_git(owner, url, ref, token=None, credential=None):
    """The owner's snapshot of the repository `url` (git_source's) at `ref`, and the commit the
    ref resolved to. The portal fetches it, now: the host must resolve only to addresses the
    site allows (destinations, its list for git), and git connects to the one checked. `token`
    (https) is used for this fetch only; `credential`, one of the owner's GitCredentials, is
    decrypted for it. BadGit or BadProject say what failed; nothing is kept."""
    ssh_key = None
    if credential is not None:
        try:
            secret = secrets.decrypt(credential.secret_encrypted, what=f"The git credential {credential.name!r}",
                                     again="add it again")
        except secrets.SecretError as exc:
            raise BadGit(str(exc)) from None
        if credential.kind == GitCredential.Kind.SSH_KEY:
            ssh_key = secret
        else:
            token = secret
    try:
        address = destinations.checked(url.host, url.port, allowed=destinations.git_allowed_networks(),
                                       unless=destinations.GIT_UNLESS)[0]
    except destinations.Refused as exc:
        raise BadGit(str(exc)) from None
    fetched = gitfetch.fetch(url, ref, address=str(address), timeout=settings.RINGMASTER_GIT_TIMEOUT_SECONDS,
                             max_bytes=limits().expanded_bytes, schemes=tuple(settings.RINGMASTER_GIT_SCHEMES),
                             token=token, ssh_key=ssh_key, known_hosts=settings.RINGMASTER_GIT_SSH_KNOWN_HOSTS)
    try:
        return store(owner, fetched.archive), fetched.commit
    except BadProject as exc:
        raise BadProject(f"At commit {fetched.commit[:12]}: {exc}") from None


def credential_problem(credential, url):
    """Why `credential` cannot be used for `url` (None: it can): a token goes to https, a key to ssh."""
    if credential.kind == GitCredential.Kind.SSH_KEY and url.scheme != "ssh":
        return f"The git credential {credential.name!r} is an SSH key: it is for ssh:// URLs."
    if credential.kind == GitCredential.Kind.TOKEN and url.scheme not in ("https", "http"):
        return f"The git credential {credential.name!r} is a token: it is for https:// URLs."
    return None


def add_git_credential(owner, name, kind, secret=""):
    """A new GitCredential of `owner`, its secret stored encrypted: a token, or an SSH private key
    (given, unencrypted, or made here when none is given: ed25519). ValueError says what is wrong
    with a key given."""
    public = ""
    if kind == GitCredential.Kind.SSH_KEY:
        secret, public = read_ssh_key(secret)
    return GitCredential.objects.create(owner=owner, name=name, kind=kind, secret_encrypted=secrets.encrypt(secret),
                                        public_key=public)


def read_ssh_key(text):
    """(the private key in OpenSSH's format, its public half) of `text` (none: of a new ed25519
    key); ValueError where `text` is not an unencrypted private key ssh takes."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    if text:
        data = text.strip().encode() + b"\n"
        try:
            loader = serialization.load_ssh_private_key if b"OPENSSH PRIVATE KEY" in data \
                else serialization.load_pem_private_key
            key = loader(data, password=None)
        except TypeError:
            raise ValueError("The key is protected by a passphrase: give it without one.") from None
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise ValueError(f"Not an SSH private key this portal reads: {exc}") from None
    else:
        key = ed25519.Ed25519PrivateKey.generate()
    try:
        private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                    serialization.NoEncryption()).decode()
        public = key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                               serialization.PublicFormat.OpenSSH).decode()
    except (ValueError, TypeError) as exc:
        raise ValueError(f"Not a key ssh takes: {exc}") from None
    return private, f"{public} ringmaster"


def visible_git_credentials(user):
    return GitCredential.objects.filter(owner=user)


def visible_projects(user):
    return Project.objects.filter(owner=user)


def entry_point_problem(project, entry_point):
    """Why the job cannot start at `entry_point` in `project` (None: it can)."""
    return projects.entry_point_problem(
        [projects.File(item["path"], b"") for item in project.listing], entry_point)


def requirements(project):
    """The project's extra packages (runners.packages.Requirements; None: it names none);
    packages.BadRequirements names the line that is refused."""
    wanted = {packages.REQUIREMENTS_FILE, packages.PYPROJECT_FILE} & {item["path"] for item in project.listing}
    if not wanted:
        return None
    return packages.requirements({file.path: file.content for file in projects.unpack(bytes(project.archive))
                                  if file.path in wanted})


def requirements_problem(project, image, backend=None):
    """Why the project's extra packages cannot be installed on `image` by `backend` (a Backend;
    None: not asked) (None: they can, or it names none)."""
    try:
        reqs = requirements(project)
    except packages.BadRequirements as exc:
        return str(exc)
    if reqs is not None and not image.extra_packages:
        return (f"The image {image.name} takes no extra packages, and the project's {reqs.source} names "
                f"{reqs.packages}: pick another image, or leave them out.")
    if reqs is not None and backend is not None and not backend.installs_packages:
        return (f"{backend.label} cannot install a project's extra packages yet, and the project's {reqs.source} "
                f"names {reqs.packages}: use an image that has them, or run it on a backend that installs them.")
    return None


def source_report(project, entry_point):
    """sourcecheck's Report of the project run from `entry_point` (a path of its listing): what
    does not compile, and the launcher its code asks for."""
    key = (project.sha256, entry_point)
    report = _reports.get(key)
    if report is None:
        files = {file.path: file.content for file in projects.unpack(bytes(project.archive))}
        report = sourcecheck.report(files, entry_point)
        with _reports_lock:
            while len(_reports) >= REPORTS_KEPT:
                _reports.pop(next(iter(_reports)))
            _reports[key] = report
    return report


def script_report(name, content):
    """sourcecheck's Report of a one-file script (its text)."""
    return sourcecheck.report({name: content.encode()}, name)


def clean_entry_point(entry_point):
    """An entry point as the project's listing names it (e.g. "./train.py" -> "train.py")."""
    return projects.clean_path(entry_point)


def open_file(project, path):
    """The bytes of the file at `path` in the snapshot; KeyError where it has none."""
    name = projects.clean_path(path)
    for file in projects.unpack(bytes(project.archive)):
        if file.path == name:
            return file.content
    raise KeyError(path)


def job_files(job):
    """[{"path", "size"}] of what `job` runs: its project's files, its one uploaded script (a
    one-file project), or none (a script inside its image)."""
    if job.project_id:
        return job.project.listing
    if job.script_id:
        return [{"path": job.script.name, "size": job.script.size}]
    return []


def job_file(job, path):
    """The bytes of one file `job` runs; KeyError where it has none of that name."""
    if job.project_id:
        return open_file(job.project, path)
    if job.script_id and path == job.script.name:
        return job.script.content.encode()
    raise KeyError(path)
