"""What a backend is: everything that differs between the ways Ringmaster runs a job.

A backend is a class in its own module under jobs/backends/, enabled by listing its dotted path
in settings.RINGMASTER_BACKENDS (jobs.backends loads them, as django.contrib.auth loads
AUTHENTICATION_BACKENDS). It answers for its jobs in five places, and nowhere else does the
portal ask which backend a job has:

- submission: its own fields and limits (clean), kept in its own tables (record(),
  field_values(), field_values_of() for a page of jobs);
- admission: how many GPUs it can hold (capacity), why a job waits, and what an admitted job
  holds until it ends (admission(), release());
- running: the runner and what a launch leaves behind (runner(), after_launch());
- artifacts: where the portal reads the files a job writes (artifacts_root()), how it brings
  them there within the owner's storage quota (collect_artifacts()) and deletes them;
- the job page: links it adds, and the object it creates for a job (document()).

What it owns besides: a periodic health check that beat runs only while it is enabled
(check_every, periodic_check()), its own table on the capacity page (capacity_table()), and,
where its package is a Django app (an apps.py or a models.py beside it), its models, migrations
and admin, installed only while it is enabled (portal.settings.backend_apps).
"""
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from jobs.backends.waits import Wait
from jobs.installation import installation_id
from jobs.models import Image, gpus_in_use
from runners import artifacts
from runners.base import job_name
from runners.gpus import matches


@dataclass(frozen=True)
class CapacityTable:
    """A backend's own table on the capacity page: `template` renders one card from `rows`
    (whatever the template needs: model rows, dicts)."""

    template: str
    rows: list


@dataclass(frozen=True)
class QueuedJob:
    """A queued job as one admission pass sees it (a row, not a model: the pass reads thousands)."""

    pk: int
    owner_id: int
    owner: str
    group_id: int | None
    group: str
    backend: str
    gpus: int
    held: bool
    held_by: str | None
    reason: str
    gpu_model: str = ""
    max_gpus: int | None = None      # elastic: the most it may grow to
    size: int | None = None          # what an admitted job holds now
    priority: int = 0
    waits_for: str = ""              # the kind of its wait (jobs.backends.waits)
    restart_after: object = None     # a restarted job's backoff: not admitted before (a datetime)
    attempt: int = 1

    @property
    def gpus_in_use(self):
        return gpus_in_use(self.size, self.gpus)


# The Job fields a QueuedJob is made of, in its order (values_list(*QUEUED_JOB_FIELDS)).
QUEUED_JOB_FIELDS = ("id", "owner_id", "owner__username", "charged_group_id", "charged_group__name", "backend",
                     "gpus", "held", "held_by__username", "reason", "gpu_model", "max_gpus", "size",
                     "priority", "waits_for", "restart_after", "attempt")


class Admission:
    """A backend's part of one admission pass, under the scheduler's lock.

    The scheduler asks, job by job in queue order: is the capacity this job needs already
    reserved by an earlier job that waits (capacity_key, behind)? If not, does it fit now
    (why_waiting)? Both answer with a Wait (jobs.backends.waits). A job that fits is admitted
    and charged (admitted_message, charge), so the next job of the same pass sees the GPUs it
    took.

    The default: `backend.capacity()` GPUs at once (None: no limit), counted from the jobs that
    are launching or running on the backend (`book.backend_gpus`).
    """

    def __init__(self, backend, book):
        self.backend, self.book = backend, book
        self._capacity = None
        self._capacity_read = False

    def capacity_key(self, job):
        """What a waiting job reserves, so a later smaller job does not take it first."""
        return ("capacity", self.backend.name)

    def behind(self, job):
        """The Wait of a job whose capacity an earlier waiting job reserved."""
        return Wait("capacity_behind", backend=self.backend.name)

    def why_waiting(self, job):
        """Why `job` cannot start now (a Wait), or None: it fits."""
        if not self._capacity_read:
            self._capacity, self._capacity_read = self.backend.capacity(), True
        if self._capacity is None:
            return None
        in_use = self.book.backend_gpus(self.backend.name)
        if in_use + job.gpus > self._capacity:
            return Wait("capacity", in_use=in_use, capacity=self._capacity, gpus=job.gpus)
        return None

    def admitted_message(self, job):
        return "admitted"

    def charge(self, job):
        """Record what the admitted `job` now holds (its GPUs in the book are counted already)."""

    # --- elastic jobs (Backend.elastic) ---------------------------------------------------------
    def room(self, job):
        """How many more GPUs `job` could hold here now (None: no limit of the backend's own)."""
        if not self._capacity_read:
            self._capacity, self._capacity_read = self.backend.capacity(), True
        if self._capacity is None:
            return None
        return max(self._capacity - self.book.backend_gpus(self.backend.name), 0)

    def step(self, job):
        """The GPUs an elastic job grows or shrinks by at a time (a Kubernetes worker's GPUs)."""
        return 1

    def shares_capacity(self, job, other):
        """Whether GPUs that the running `other` gives back could go to `job` (the backend's
        pool; a Kubernetes job's own cluster)."""
        return True

    def fixed_size(self, job):
        """Why the portal may not grow or shrink the elastic `job` (something else decides its
        size, e.g. Kueue), which then runs at the size it started at; "" where it may."""
        return ""

    def where(self, job):
        """Where the GPUs a job grows into are, in an event ("on this machine")."""
        return f"on {self.backend.label}"

    def resize(self, job, size):
        """Record that the admitted elastic `job` now holds `size` GPUs instead of job.gpus_in_use; the
        book's GPU counts are changed by the scheduler."""

    def lost(self, job):
        """[(host name, why, GPUs the job holds there)] of the hosts a running elastic job lost (it
        goes on without them)."""
        return []

    def drop(self, job, name):
        """Free what the job held on the lost host `name`; returns the GPUs it held there."""
        raise NotImplementedError


def interpreter_problem(image, where):
    """An image for a backend that runs an interpreter (this machine, instances): not a container."""
    if not image.container_image:
        return None
    fitting = ", ".join(Image.objects.filter(enabled=True, container_image="").values_list("name", flat=True))
    return (f"Image {image.name} is a container image ({image.container_image}) for Kubernetes clusters; "
            f"{where} needs an image with an interpreter" + (f": {fitting}." if fitting else "."))


class Backend:
    name = ""            # stored in Job.backend; what the API's "backend" takes
    label = ""           # what the job form shows
    # A launch still LAUNCHING after RINGMASTER_LAUNCH_TIMEOUT_SECONDS is failed by reconcile.
    # False for a backend whose jobs wait in a scheduler of their own (a cluster's).
    launch_times_out = True
    admission_class = Admission
    # Whether a running job's hosts are sampled (runner.system_probe); if not, what the page says.
    collects_system_metrics = True
    system_metrics_note = ""
    # Whether a job may be elastic here (max_gpus): its runner resizes a running job (Runner.resize).
    elastic = False
    # The launchers (runners.launchers) whose jobs its runner can start.
    launchers = ("horovod", "torchrun")
    # Whether its runner lays out a project (JobSpec.project) where the ranks run.
    runs_projects = False
    # Whether its runner installs a project's extra packages (runners.packages) before the ranks.
    installs_packages = False
    # Whether a job may have restarts (jobs.domain.recovery): its runner launches a new attempt
    # (JobSpec.attempt) of a job it launched before anew, and its artifacts_root holds the job's
    # checkpoints while it runs.
    restarts_jobs = False
    # Seconds between two runs of periodic_check() by Celery beat (jobs.backends.check_schedule);
    # None: it has none. Beat schedules only the enabled backends.
    check_every = None

    def __str__(self):
        return self.name

    # --- submission -----------------------------------------------------------------------
    def offered(self):
        """Whether the job form offers this backend (not while nothing stands behind it)."""
        return self.unavailable() is None

    def unavailable(self):
        """Why no job can go to this backend now, saying what an admin must add; None if one can."""
        return None

    def api_fields(self):
        """Fields of its own that a submission through the API (and so the CLI) may carry:
        {name: django.forms.Field}. jobs.web.forms.JobForm takes those of every enabled backend
        and refuses one given for a backend that does not declare it."""
        return {}

    def page_fields(self):
        """Fields of its own for the browser's job form, under the names of its api_fields:
        {name: django.forms.Field}."""
        return {}

    def largest_job(self):
        """The most GPUs one job may ask for here, or None: no limit of the backend's own."""
        return None

    def gpus_note(self):
        """What the job form says under "GPUs" about this backend ("" for nothing)."""
        return ""

    def isolation_note(self):
        """What the job form says under "Backend" about what a job here shares with others
        ("" where each job is kept apart from every other)."""
        return ""

    def image_problem(self, image):
        """Why `image` cannot run on this backend (naming where it can), or None."""
        return None

    def gpu_models(self):
        """The GPU models (nvidia-smi names) a job may ask for here, or None: this backend does
        not choose GPUs by model."""
        return None

    def gpu_model_problem(self, model):
        """Why a job cannot ask for GPUs of `model` here (naming the models there are), or None."""
        models = self.gpu_models()
        if models is None:
            return f"The {self.name} backend does not choose GPUs by model; leave the GPU model blank."
        if not any(matches(name, model) for name in models):
            return (f"No GPU is a {model} on {self.label}; the models there are: "
                    f"{', '.join(models) if models else 'no GPU nvidia-smi could see'}.")
        return None

    def clean(self, form, data):
        """Check a submission's backend-specific fields; report with form.add_error(field, text).
        `data` is the form's cleaned data and may be completed (e.g. a default cluster)."""
        image = data.get("image")
        problem = self.image_problem(image) if image is not None else None
        if problem and "image" not in form.errors:
            form.add_error("image", problem)
        model = (data.get("gpu_model") or "").strip()
        if model:
            problem = self.gpu_model_problem(model)
            if problem and "gpu_model" not in form.errors:
                form.add_error("gpu_model", problem)
        limit, gpus = self.largest_job(), data.get("gpus")
        if limit is not None and gpus and gpus > limit and "gpus" not in form.errors:
            form.add_error("gpus", self.too_large(limit))

    def max_gpus_problem(self, most, launcher):
        """Why an elastic job of `launcher` may not grow to `most` GPUs here, or None."""
        if not self.elastic:
            return f"{self.label} does not resize jobs; leave Most GPUs empty."
        problem = self.elastic_problem(launcher)
        if problem:
            return problem
        limit = self.largest_job()
        return self.too_large(limit) if limit is not None and most > limit else None

    def elastic_problem(self, launcher):
        """Why this backend cannot resize jobs of `launcher` (a name of runners.launchers), or
        None."""
        return None

    def too_large(self, limit):
        return f"The {self.name} backend runs at most {limit} GPUs per job."

    def record(self, job, data):
        """Keep what the new `job`'s own fields chose (`data`: the cleaned data; e.g. its cluster)
        in the backend's own tables, in the submission's transaction."""

    def field_values(self, job):
        """The values of its own fields (api_fields) for `job`, API-shaped: what the API and the
        job page show of it, and what a rerun submits again."""
        return {}

    def field_values_of(self, jobs):
        """field_values of many of its jobs at once, {job pk: values}: what a page of the job list
        asks. A backend whose values cost a query per job reads them all in one here."""
        return {job.pk: self.field_values(job) for job in jobs}

    # --- admission --------------------------------------------------------------------------
    def capacity(self):
        """GPUs this backend can run at once; None where it queues beyond its size itself."""
        return None

    def admission(self, book):
        return self.admission_class(self, book)

    def release(self, job_id):
        """Free what the job held (it has ended, whichever way; inside that transaction)."""

    # --- running ----------------------------------------------------------------------------
    def runner(self, job):
        """The runners.base.Runner that runs `job`."""
        raise NotImplementedError

    def after_launch(self, job, runner, error=None):
        """Keep what a launch (or a failed one) taught the backend."""

    def seed(self, stdout, stderr):
        """What `manage.py seed_demo` (make run's first start) adds for this backend: e.g. the
        cluster a KUBECONFIG names. Idempotent."""

    def periodic_check(self):
        """The health check beat runs every `check_every` seconds (jobs.tasks.check_backend):
        look at what the backend runs jobs on and record what was found, so that admission and
        the pages see it. Returns {name: ok} of what it checked."""
        return {}

    def watch_hosts(self, job):
        """Look at the hosts of a running elastic job (its follower asks every few seconds) and
        record a lost one, for the scheduler to drop (Admission.lost)."""

    # --- artifacts (the files a job writes under RINGMASTER_OUTPUT_DIR) -----------------------
    # Whether a running job's artifacts can be brought back on request ("Fetch now"); False where
    # artifacts_root already shows them as they are written.
    fetches_artifacts = False
    # What the job page says where this backend keeps no artifacts for the portal ("": it does).
    artifacts_note = ""
    # Whether its runner puts a rerun's checkpoint (JobSpec.checkpoint) in the job's folder.
    takes_checkpoints = False

    def artifacts_root(self, job):
        """The folder on the portal's machine that holds `job`'s artifacts (runners.artifacts
        reads it), or None where the portal keeps none: by default the portal's own storage for
        the job (RINGMASTER_ARTIFACTS_DIR, named by the installation's id and the job's), where
        collect_artifacts brings them; no job's sandbox sees it."""
        return Path(settings.RINGMASTER_ARTIFACTS_DIR) / job_name(installation_id(), job.pk)

    def collect_artifacts(self, job, room):
        """Bring `job`'s artifacts into artifacts_root, at most `room` bytes (None: no limit).
        Returns (bytes kept, why not all were kept or "")."""
        root = self.artifacts_root(job)
        kept = artifacts.total_size(root) if root is not None else 0
        if room is not None and kept > room:
            return kept, f"the job's artifacts ({kept} bytes) exceed the owner's storage quota"
        return kept, ""

    def delete_artifacts(self, job):
        """Delete what artifacts_root holds of `job` (retention); an OSError where something
        cannot be deleted."""
        root = self.artifacts_root(job)
        if root is not None:
            artifacts.remove_tree(root)

    # --- the capacity page -----------------------------------------------------------------------
    def capacity_table(self):
        """Its own table on the staff capacity page (a CapacityTable), or None: nothing to show."""
        return None

    # --- the job page -------------------------------------------------------------------------
    def links(self, job):
        """[(label, url, element id)] the job page adds for this backend."""
        return []

    def document(self, job):
        """(kind, the object as JSON-ready data) this backend creates for `job`, or None.
        Raises ValueError naming what keeps it from being made."""
        return None

    def document_problems(self, document):
        """What the system that receives `document` would refuse in it ([] if nothing)."""
        return []
