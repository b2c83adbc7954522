"""A job's artifacts: the files its ranks write under RINGMASTER_OUTPUT_DIR.

Where they are read from is the job's backend's (Backend.artifacts_root: a local job's own output
folder, the portal's storage for what was brought back from an instance, none on Kubernetes);
reading them never follows a link out of that folder (runners.artifacts). They count against
their owner's storage quota (Quota.storage_gb on the user's all-backends row): a bring-back
stops where the quota would be passed, and says so on the job (Job.artifacts_note). Beat deletes
those of jobs that ended more than RINGMASTER_ARTIFACT_RETENTION_DAYS ago. A folder is walked
within runners.artifacts' limits (MAX_DEPTH, MAX_ENTRIES): what lies beyond is listed as skipped,
not counted and not archived, and deleted all the same.
"""
import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from jobs import backends
from jobs.models import Job, Quota
from runners import artifacts
from runners.artifacts import BadName  # noqa: F401  (callers catch it from here)

GB = 1000 ** 3
log = logging.getLogger(__name__)


def root(job):
    """The folder holding `job`'s artifacts on this machine, or None (none kept, or deleted)."""
    if job.artifacts_deleted_at is not None:
        return None
    try:
        return backends.of(job).artifacts_root(job)
    except backends.UnknownBackend:
        return None


def note(job):
    """What the job page says about where the job's artifacts are ("" where they are listed)."""
    try:
        backend = backends.of(job)
    except backends.UnknownBackend:
        return ""
    if job.artifacts_deleted_at is not None:
        return f"The job's artifacts were deleted after {settings.RINGMASTER_ARTIFACT_RETENTION_DAYS:g} days."
    return backend.artifacts_note if backend.artifacts_root(job) is None else ""


def fetches(job):
    """Whether "Fetch now" brings a running job's artifacts here (its backend copies them)."""
    try:
        return backends.of(job).fetches_artifacts and job.artifacts_deleted_at is None
    except backends.UnknownBackend:
        return False


def walk(job):
    """The files of `job`'s artifacts within the walk's limits, and the folders left out
    (runners.artifacts.Tree)."""
    folder = root(job)
    return artifacts.walk(folder) if folder is not None else artifacts.Tree([], [])


def open_file(job, name):
    """The artifact `name` of `job`, open for reading: BadName for a name that leaves the
    folder, FileNotFoundError for one that is not there."""
    artifacts.parts(name)
    folder = root(job)
    if folder is None:
        raise FileNotFoundError(name)
    return artifacts.open_artifact(folder, name)


def archive_chunks(job):
    """The job's artifacts as a .tar.gz, in pieces (a streamed download)."""
    return artifacts.tar_gz(root(job))


# --- the storage quota -----------------------------------------------------------------------------

def storage_limit(user):
    """Bytes of artifacts `user`'s jobs may keep at once, or None: no limit."""
    gb = Quota.objects.filter(user=user, backend="").values_list("storage_gb", flat=True).first()
    return None if gb is None else int(gb * GB)


def storage_used(user, exclude=None):
    """Bytes of artifacts kept for `user`'s jobs (but `exclude`'s)."""
    jobs = Job.objects.filter(owner=user, artifacts_deleted_at__isnull=True)
    if exclude is not None:
        jobs = jobs.exclude(pk=exclude.pk)
    return jobs.aggregate(total=Sum("artifacts_bytes"))["total"] or 0


def storage_summary(user):
    """The storage quota as GET /api/quota/ and the quota panel show it."""
    limit = storage_limit(user)
    return {"limit_bytes": limit, "used_bytes": storage_used(user)}


def collect(job):
    """Bring `job`'s artifacts to where the portal reads them (its backend's way), within what
    its owner's storage quota leaves, and record their size and, where not all fit, why."""
    try:
        backend = backends.of(job)
    except backends.UnknownBackend:
        return job
    if job.artifacts_deleted_at is not None or backend.artifacts_root(job) is None:
        return job
    limit = storage_limit(job.owner)
    room = None if limit is None else max(0, limit - storage_used(job.owner, exclude=job))
    try:
        kept, why = backend.collect_artifacts(job, room)
    except Exception as exc:        # an instance away, a connection dropped: said, not raised
        log.warning("job %s: artifacts not brought back: %s", job.pk, exc)
        kept, why = job.artifacts_bytes, f"the artifacts could not be brought back: {exc or type(exc).__name__}"
    Job.objects.filter(pk=job.pk).update(artifacts_bytes=kept, artifacts_note=why[:500])
    job.artifacts_bytes, job.artifacts_note = kept, why[:500]
    return job


def expire(now=None):
    """Delete the artifacts of jobs that ended more than the retention period ago; returns how
    many jobs' artifacts were deleted. A job whose files cannot be deleted is logged and left
    for the next pass; the others are deleted all the same."""
    now = now or timezone.now()
    before = now - timedelta(days=settings.RINGMASTER_ARTIFACT_RETENTION_DAYS)
    done = 0
    for job in Job.objects.filter(finished_at__lt=before, artifacts_deleted_at__isnull=True).iterator():
        try:
            backends.of(job).delete_artifacts(job)
        except backends.UnknownBackend:
            continue
        except Exception as exc:    # an OSError is said in one line; anything else with its traceback
            log.warning("job %s: its artifacts could not be deleted (retention tries again next pass): %s",
                        job.pk, exc, exc_info=not isinstance(exc, OSError))
            continue
        Job.objects.filter(pk=job.pk).update(artifacts_deleted_at=now, artifacts_bytes=0)
        done += 1
    return done


# --- rerun from a checkpoint -------------------------------------------------------------------------

def _takes_checkpoints(job):
    try:
        return backends.of(job).takes_checkpoints
    except backends.UnknownBackend:
        return False


def newest_checkpoint(job):
    """The name of `job`'s newest artifact matching its checkpoint pattern, or None (also where
    a rerun on its backend could not be given the file)."""
    folder = root(job)
    if not job.checkpoint_pattern or folder is None or not _takes_checkpoints(job):
        return None
    return artifacts.newest_match(folder, job.checkpoint_pattern)



def no_checkpoint(job):
    """Why `job` cannot be rerun from a checkpoint (newest_checkpoint found none)."""
    if not job.checkpoint_pattern:
        return "The job has no checkpoint pattern; give one (e.g. *.pt) when submitting it."
    if root(job) is None:
        return note(job) or "The job's artifacts are not kept by the portal."
    if not _takes_checkpoints(job):
        return f"The {backends.label(job.backend)} backend cannot give a new job a checkpoint."
    return f"No artifact of job {job.pk} matches {job.checkpoint_pattern}."
