"""Projects a user uploads as an archive or names as a git repository at a ref: read as untrusted
(runners.projects; git's fetch: runners.gitfetch), kept once per owner by digest, and read back
file by file for the job page and the API."""
from django.conf import settings
from django.db import IntegrityError, transaction

from jobs.domain import destinations
from jobs.models import Project
from runners import gitfetch, projects
from runners.gitfetch import BadGit  # noqa: F401  (callers catch it from here)
from runners.projects import BadProject  # noqa: F401  (callers catch it from here)

MB = 1 << 20


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


def store_git(owner, url, ref, token=None):
    """The owner's snapshot of the repository `url` (git_source's) at `ref`, and the commit the
    ref resolved to. The portal fetches it, now: the host must resolve only to addresses the
    site allows (destinations, its list for git), and git connects to the one checked. `token`
    (https) is used for this fetch only. BadGit or BadProject say what failed; nothing is kept."""
    try:
        address = destinations.checked(url.host, url.port, allowed=destinations.git_allowed_networks(),
                                       unless=destinations.GIT_UNLESS)[0]
    except destinations.Refused as exc:
        raise BadGit(str(exc)) from None
    fetched = gitfetch.fetch(url, ref, address=str(address), timeout=settings.RINGMASTER_GIT_TIMEOUT_SECONDS,
                             max_bytes=limits().expanded_bytes, schemes=tuple(settings.RINGMASTER_GIT_SCHEMES),
                             token=token, known_hosts=settings.RINGMASTER_GIT_SSH_KNOWN_HOSTS)
    try:
        return store(owner, fetched.archive), fetched.commit
    except BadProject as exc:
        raise BadProject(f"At commit {fetched.commit[:12]}: {exc}") from None


def visible_projects(user):
    return Project.objects.filter(owner=user)


def entry_point_problem(project, entry_point):
    """Why the job cannot start at `entry_point` in `project` (None: it can)."""
    return projects.entry_point_problem(
        [projects.File(item["path"], b"") for item in project.listing], entry_point)


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
