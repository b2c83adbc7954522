"""Studies: a hyperparameter search in which every trial is an ordinary job (DESIGN.md's contract).

Optuna drives it ask-and-tell. Its storage is its RDB storage in the portal's own PostgreSQL
(storage(): the SQLAlchemy URL of Django's connection), or on the embedded SQLite default its
journal file under the data folder, so a study needs no second service and survives any restart.
drive() is one pass over a study, under a row lock on it (two workers never ask for the same
trial twice):

1. trials whose jobs ended are told to Optuna: the objective is the metric's last value among the
   job's stored metric points; a failed job is a failed trial, retried once (Optuna's
   RetryFailedTrialCallback enqueues its parameters again); a first finished trial that never
   reported the metric fails the study rather than spending its budget;
2. with a pruner, each running trial's new metric points are reported as intermediate values,
   and a trial Optuna prunes has its job cancelled with a reason that says why;
3. new trials are asked for until `parallel` run at once and `trials` were asked (a retry is not
   counted): each is a job submitted through services.submit with the caller's JobForm (the web
   layer's: the same validation, queue, quotas and isolation as any job), tagged study-<id>;
4. a study whose budget is spent and whose trials all ended is DONE.

The Trial row (with its job) is written in the transaction that holds the lock: an Optuna trial
asked in a pass that then failed has no row, and the next pass tells Optuna it failed.
"""
import itertools
import logging
import os
import re
import statistics
import threading
import uuid
import warnings

from django.conf import settings as django_settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from jobs.domain import services
from jobs.models import MetricPoint, State as JobState, Study, Trial

log = logging.getLogger(__name__)

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("none", "median", "hyperband")
DIRECTIONS = ("minimize", "maximize")
TYPES = ("float", "int", "categorical")
MAX_TRIALS = 1000
MAX_GRID = 100_000
MEDIAN_STARTUP_TRIALS = 2      # the median pruner compares with this many finished trials at least


def tag_of(study_id):
    """The tag every trial's job of a study carries."""
    return f"study-{study_id}"


# --- the base job and its placeholders --------------------------------------------------------
def placeholders(base):
    """The names of the {name} placeholders in a base job's args and env values."""
    texts = [arg for arg in base.get("args") or [] if isinstance(arg, str)]
    env = base.get("env") or {}
    if isinstance(env, dict):
        texts += [value for value in env.values() if isinstance(value, str)]
    return {name for text in texts for name in PLACEHOLDER.findall(text)}


def format_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def substitute(base, params):
    """The base job's fields with each {name} in args and env values replaced by params[name]."""
    def fill(text):
        return PLACEHOLDER.sub(lambda m: format_value(params[m.group(1)]) if m.group(1) in params else m.group(0), text)

    data = dict(base)
    if isinstance(base.get("args"), list):
        data["args"] = [fill(arg) if isinstance(arg, str) else arg for arg in base["args"]]
    if isinstance(base.get("env"), dict):
        data["env"] = {name: fill(value) if isinstance(value, str) else value for name, value in base["env"].items()}
    return data


def sample(space):
    """One point of a (valid) search space: each range's low end, each categorical's first choice."""
    return {name: entry["choices"][0] if entry["type"] == "categorical" else entry["low"]
            for name, entry in space.items()}


def grid_of(space):
    """{name: [values]} for the grid sampler; None where an entry is a float range (no grid)."""
    grid = {}
    for name, entry in space.items():
        if entry["type"] == "categorical":
            grid[name] = list(entry["choices"])
        elif entry["type"] == "int":
            grid[name] = list(range(entry["low"], entry["high"] + 1))
        else:
            return None
    return grid


def grid_size(space):
    """The number of points of the grid (counted, not built: an int range may be long)."""
    size = 1
    for entry in space.values():
        size *= len(entry["choices"]) if entry["type"] == "categorical" else entry["high"] - entry["low"] + 1
    return size


def budget(spec):
    """How many trials the study asks for (retries not counted): `trials`, or the whole grid where
    that is smaller."""
    if spec["sampler"] == "grid":
        return min(spec["trials"], grid_size(spec["space"]))
    return spec["trials"]


def job_data(study, number, params):
    """The API fields of a trial's job: the base with its parameters, named and tagged for the study."""
    base = study.spec["base"]
    data = substitute(base, params)
    data["name"] = f"{study.name} #{number}"[:100]
    tags, note = base.get("tags") or [], base.get("note") or ""
    data["tags"] = (tags if isinstance(tags, list) else [tags]) + [tag_of(study.pk)]   # JobForm checks them
    shown = ", ".join(f"{name}={format_value(value)}" for name, value in sorted(params.items()))
    if isinstance(note, str):
        data["note"] = "\n\n".join(filter(None, [note, f"Study {study.name}, trial {number}: {shown}"]))
    return data


# --- visibility and lifecycle -----------------------------------------------------------------
def visible_studies(user):
    """A user's own studies; another user's study is 404."""
    return Study.objects.filter(owner=user)


def create(user, spec):
    """A RUNNING study of a valid spec (jobs.web.study_forms.StudyForm); its first pass is queued."""
    from jobs import taskqueue

    with transaction.atomic():
        study = Study.objects.create(owner=user, name=spec["name"], spec=spec,
                                     optuna_name=f"ringmaster-study-{uuid.uuid4().hex}")
        taskqueue.drive_study(study.pk)
    return study


def stop(study, by):
    """Stop a running study: no more trials, its running trials' jobs cancelled."""
    with transaction.atomic():
        locked = Study.objects.select_for_update().get(pk=study.pk)
        if locked.state == Study.State.RUNNING:
            _end(locked, Study.State.STOPPED, f"stopped by {by.get_username()}")
    return locked


def _end(study, state, reason):
    """End a locked study: its state and reason, and every trial still running cancelled."""
    study.state, study.reason, study.finished_at = state, reason[:500], timezone.now()
    study.save(update_fields=["state", "reason", "finished_at"])
    for trial in study.trials.filter(state=Trial.State.RUNNING).select_related("job"):
        if trial.job is not None:
            try:
                services.cancel(trial.job, by=study.owner, reason=f"{study} {state.lower()}: {reason}"[:500])
            except services.CannotCancel:
                pass
        trial.state, trial.reason = Trial.State.FAIL, f"the study {state.lower()}"
        trial.save(update_fields=["state", "reason"])


def best(study):
    """The best COMPLETE trial (by the objective's direction), or None."""
    done = study.trials.filter(state=Trial.State.COMPLETE, value__isnull=False)
    order = "value" if study.spec["objective"]["direction"] == "minimize" else "-value"
    return done.order_by(order, "number").select_related("job").first()


# --- Optuna -----------------------------------------------------------------------------------
_storages = {}
_storages_lock = threading.Lock()


def database_url():
    """The SQLAlchemy URL of Django's default database (the one in use: a test run's too), where it
    is PostgreSQL; None otherwise."""
    from sqlalchemy.engine import URL

    settings = connection.settings_dict
    if connection.vendor != "postgresql":
        return None
    return URL.create("postgresql+psycopg2", username=settings["USER"] or None,
                      password=settings["PASSWORD"] or None, host=settings["HOST"] or None,
                      port=int(settings["PORT"]) if settings["PORT"] else None,
                      database=settings["NAME"]).render_as_string(hide_password=False)


def storage():
    """Optuna's storage, one per process. On PostgreSQL, its RDB storage in the portal's database
    (its tables created once). On the embedded SQLite, its journal file under the data folder:
    a pass holds SQLite's one write lock while it asks Optuna, so Optuna cannot write to that file."""
    import optuna

    url = database_url()
    key = url or str(django_settings.DATA_DIR / "optuna" / "studies.journal")
    with _storages_lock:
        if key not in _storages:
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            if url:
                _storages[key] = optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
            else:
                folder = django_settings.DATA_DIR / "optuna"
                folder.mkdir(mode=0o700, exist_ok=True)
                os.close(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600))     # as the database file
                _storages[key] = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(key))
        return _storages[key]


def close_storages():
    """Close the storages' pooled connections (a test database about to be dropped); a storage
    used again opens new ones."""
    with _storages_lock:
        for found in _storages.values():
            if hasattr(found, "engine"):
                found.engine.dispose()


def _sampler(spec):
    import optuna

    if spec["sampler"] == "grid":
        class Grid(optuna.samplers.GridSampler):
            def after_trial(self, study, trial, state, values):
                """Nothing: a grid study ends with its budget (studies.budget: at most the grid);
                GridSampler's own Study.stop() works only inside study.optimize()."""

        return Grid(grid_of(spec["space"]))
    if spec["sampler"] == "random":
        return optuna.samplers.RandomSampler()
    return optuna.samplers.TPESampler()


def _pruner(spec):
    import optuna

    if spec["pruner"] == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=MEDIAN_STARTUP_TRIALS)
    if spec["pruner"] == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource="auto")
    return optuna.pruners.NopPruner()


def distributions(space):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    found = {}
    for name, entry in space.items():
        if entry["type"] == "categorical":
            found[name] = CategoricalDistribution(entry["choices"])
        elif entry["type"] == "int":
            found[name] = IntDistribution(entry["low"], entry["high"], log=bool(entry.get("log")))
        else:
            found[name] = FloatDistribution(entry["low"], entry["high"], log=bool(entry.get("log")))
    return found


def optuna_study(study):
    import optuna

    sampler, pruner = _sampler(study.spec), _pruner(study.spec)
    try:
        return optuna.load_study(study_name=study.optuna_name, storage=storage(), sampler=sampler, pruner=pruner)
    except KeyError:             # its first pass
        return optuna.create_study(study_name=study.optuna_name, storage=storage(), load_if_exists=True,
                                   direction=study.spec["objective"]["direction"], sampler=sampler, pruner=pruner)


# --- the metric ---------------------------------------------------------------------------------
def _points(job_id, metric):
    return MetricPoint.objects.filter(job_id=job_id, name=metric, step__gte=0)


def objective_value(job_id, metric):
    """The metric's last value (the highest step; the lowest rank there), or None if never reported."""
    point = _points(job_id, metric).order_by("-step", F("rank").asc(nulls_last=True), "-id").first()
    return point.value if point else None


def new_points(trial, metric):
    """[(step, value)] past the trial's last reported step, one per step (its lowest rank's)."""
    rows = _points(trial.job_id, metric).filter(step__gt=trial.last_step).order_by(
        "step", F("rank").asc(nulls_last=True), "id").values_list("step", "value")
    return [tuple(next(group)) for _, group in itertools.groupby(rows, key=lambda row: row[0])]


# --- one pass -------------------------------------------------------------------------------
def drive(study_id, job_form):
    """One pass over a running study (see the module's doc); `job_form`: the JobForm class trials
    are validated with. Returns the study, or None where it is not running."""
    with transaction.atomic():
        study = Study.objects.select_for_update().select_related("owner").filter(pk=study_id).first()
        if study is None or study.state != Study.State.RUNNING:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # Optuna's ExperimentalWarning (its retry callback)
            _Pass(study, job_form).run()
    return study


def drive_running(job_form):
    """drive() every running study (beat's pass); one that fails is logged, the others go on."""
    for study_id in Study.objects.filter(state=Study.State.RUNNING).values_list("pk", flat=True):
        try:
            drive(study_id, job_form)
        except Exception:
            log.exception("study %s: its pass failed (the next one tries again)", study_id)


class _Pass:
    def __init__(self, study, job_form):
        self.study, self.job_form = study, job_form
        self.spec = study.spec
        self.metric = self.spec["objective"]["metric"]
        self.optuna = optuna_study(study)
        self.storage = storage()

    def run(self):
        from optuna.trial import TrialState

        trials = list(self.study.trials.select_related("job"))
        numbers = {trial.number for trial in trials}
        for frozen in self.optuna.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if frozen.number not in numbers:          # asked in a pass that did not commit
                self.optuna.tell(frozen.number, state=TrialState.FAIL)
        for trial in trials:
            if trial.state == Trial.State.RUNNING and not self._follow(trial):
                return
        self._ask()

    # a running trial
    def _follow(self, trial):
        """Report its new points, tell its end or prune it; False where the study ended."""
        from optuna.trial import TrialState

        job = trial.job
        frozen = self.storage.get_trial(trial.optuna_id)
        if frozen.state.is_finished():                # told in a pass whose transaction did not commit
            trial.state = {TrialState.COMPLETE: Trial.State.COMPLETE,
                           TrialState.PRUNED: Trial.State.PRUNED}.get(frozen.state, Trial.State.FAIL)
            trial.value = frozen.value if frozen.state == TrialState.COMPLETE else trial.value
            trial.save(update_fields=["state", "value"])
            return True
        if job is None:
            self._tell(trial, TrialState.FAIL, reason="its job was deleted")
            return True
        reported = self._report(trial) if self.spec["pruner"] != "none" else None
        if job.state == JobState.SUCCEEDED:
            value = objective_value(job.pk, self.metric)
            if value is None:
                if not self.study.trials.filter(state=Trial.State.COMPLETE).exists():
                    self._tell(trial, TrialState.FAIL, reason=f"its job never reported {self.metric}")
                    self._tell_running_failed()
                    _end(self.study, Study.State.FAILED,
                         f"the objective metric {self.metric!r} was never reported by trial {trial.number} "
                         f"(job {job.pk}), the first to finish: the study stops rather than spend its budget")
                    return False
                self._tell(trial, TrialState.FAIL, reason=f"its job never reported {self.metric}")
            else:
                self._tell(trial, TrialState.COMPLETE, value=value)
        elif job.state == JobState.FAILED:
            self._tell(trial, TrialState.FAIL, reason=f"its job failed: {job.reason}"[:500], retry=True)
        elif job.state == JobState.CANCELLED:
            self._tell(trial, TrialState.FAIL, reason="its job was cancelled")
        elif reported is not None and reported.should_prune():
            self._prune(trial, reported)
        return True

    def _tell_running_failed(self):
        """Before the study ends: its running trials failed, in Optuna's record too."""
        from optuna.trial import TrialState

        for number in self.study.trials.filter(state=Trial.State.RUNNING).values_list("number", flat=True):
            self.optuna.tell(number, state=TrialState.FAIL, skip_if_finished=True)

    def _report(self, trial):
        """The trial's new metric points as Optuna's intermediate values; its optuna Trial, or
        None where there were none."""
        import optuna

        points = new_points(trial, self.metric)
        if not points:
            return None
        handle = optuna.trial.Trial(self.optuna, trial.optuna_id)
        for step, value in points:
            handle.report(value, step)
        trial.last_step = points[-1][0]
        trial.value = points[-1][1]
        trial.save(update_fields=["last_step", "value"])
        return handle

    def _prune(self, trial, handle):
        from optuna.trial import TrialState

        step, value = trial.last_step, trial.value
        if self.spec["pruner"] == "hyperband":
            reason = (f"pruned at step {step}: value {value:g}, not among the best of its Hyperband bracket "
                      f"at this rung (successive halving)")
        else:
            others = [t.intermediate_values[step] for t in self.optuna.get_trials(
                deepcopy=False, states=(TrialState.COMPLETE,)) if step in t.intermediate_values]
            median = f"{statistics.median(others):g}" if others else "unknown"
            reason = f"pruned at step {step}: value {value:g}, the median of the others {median}"
        try:
            services.cancel(trial.job, by=self.study.owner, reason=reason)
        except services.CannotCancel:
            pass
        self._tell(trial, TrialState.PRUNED, reason=reason)

    def _tell(self, trial, state, value=None, reason="", retry=False):
        from optuna.storages import RetryFailedTrialCallback
        from optuna.trial import TrialState

        self.optuna.tell(trial.number, value if state == TrialState.COMPLETE else None, state=state,
                         skip_if_finished=True)
        trial.state = {TrialState.COMPLETE: Trial.State.COMPLETE, TrialState.PRUNED: Trial.State.PRUNED}.get(
            state, Trial.State.FAIL)
        if value is not None:
            trial.value = value
        trial.reason = reason
        if retry and trial.retry_of is None:
            RetryFailedTrialCallback(max_retry=1)(self.optuna, self.storage.get_trial(trial.optuna_id))
            trial.reason = f"{reason}; retried once"[:500]
        trial.save(update_fields=["state", "value", "reason"])

    # new trials
    def _ask(self):
        from optuna.trial import TrialState

        trials = self.study.trials
        running = trials.filter(state=Trial.State.RUNNING).count()
        asked = trials.filter(retry_of__isnull=True).count()
        waiting = len(self.optuna.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        goal = budget(self.spec)
        space = distributions(self.spec["space"])
        while running < self.spec["parallel"] and (asked < goal or waiting):
            handle = self.optuna.ask(space)
            frozen = self.storage.get_trial(handle._trial_id)
            retry_of = frozen.system_attrs.get("failed_trial")
            form = self.job_form(data=job_data(self.study, handle.number, handle.params), user=self.study.owner)
            if not form.is_valid():
                self.optuna.tell(handle.number, state=TrialState.FAIL)
                self._tell_running_failed()
                problems = "; ".join(f"{name}: {' '.join(messages)}" for name, messages in form.errors.items())
                _end(self.study, Study.State.FAILED, f"trial {handle.number} could not be submitted: {problems}")
                return
            job = services.submit(self.study.owner, form)
            Trial.objects.create(study=self.study, number=handle.number, optuna_id=handle._trial_id,
                                 params=handle.params, job=job, retry_of=retry_of)
            running += 1
            if retry_of is None:
                asked += 1
            else:
                waiting -= 1
        if running == 0 and asked >= goal and not waiting:
            self.study.state, self.study.finished_at = Study.State.DONE, timezone.now()
            self.study.reason = f"{asked} trials run"
            self.study.save(update_fields=["state", "reason", "finished_at"])
