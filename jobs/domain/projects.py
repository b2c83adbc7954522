"""Projects a user uploads as an archive: read as untrusted (runners.projects), kept once per
owner by digest, and read back file by file for the job page and the API."""
import threading

from django.conf import settings
from django.db import IntegrityError, transaction

from jobs.domain import sourcecheck
from jobs.models import Project
from runners import packages, projects
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
