"""Quota arithmetic: which limits apply to a job, and how much of each is in use.

A job counts against *scopes*, and the limits of every one of them must hold:

- its owner, on all backends together. Limits: the user's Quota row for backend "", where each
  empty field falls back to the site default (settings.RINGMASTER_DEFAULT_QUOTA_*); with no row,
  the site default alone. Every job has this scope.
- its owner on the job's backend, where a Quota row for that user and backend exists.
- the group it is charged to (a Django group is a team), on all backends together, where that
  group has a Quota row: the limit is pooled across the group's members.
- that group on the job's backend, where such a row exists.

In a group's row or a per-backend row an empty field means "no limit of this kind".

Use of a scope: the GPUs and the number of its jobs that are LAUNCHING or RUNNING (admitted jobs
hold their GPUs), and its GPU-hours in a rolling window: each job's GPUs times the part of its
running time (started_at to finished_at, or to now while it runs) that falls in the last
`window_days` days. Cancelled and failed jobs count for the time they ran.

jobs.domain.scheduler.admit is the one place that applies these rules; this module only does the sums.
"""
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, Q, Sum, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from jobs.backends.waits import Wait, number, refusal as refusal_words
from jobs.domain import accounting, artifacts
from jobs.models import ACTIVE_STATES, Job, Quota, UserSettings, in_use_expression

LIMIT_NAMES = ("gpus", "jobs", "gpus_per_job", "gpu_hours")


@dataclass(frozen=True)
class Scope:
    kind: str            # "user" or "group"
    id: int
    name: str
    backend: str = ""    # "": all backends together

    @property
    def key(self):
        return (self.kind, self.id, self.backend)

    def __str__(self):
        text = f"{self.kind} {self.name}"
        return f"{text} on {self.backend}" if self.backend else text

    @property
    def quota_label(self):
        """How a message names the rule: "user quota", "group quota on kubernetes"."""
        return f"{self.kind} quota" + (f" on {self.backend}" if self.backend else "")


@dataclass(frozen=True)
class Limits:
    """None: no limit of that kind."""

    gpus: int | None = None
    jobs: int | None = None
    gpus_per_job: int | None = None
    gpu_hours: float | None = None
    window_days: int = 30
    source: str = "site default"

    def as_dict(self):
        return {"gpus": self.gpus, "jobs": self.jobs, "gpus_per_job": self.gpus_per_job,
                "gpu_hours": self.gpu_hours, "window_days": self.window_days}

    @property
    def unlimited(self):
        return all(getattr(self, name) is None for name in LIMIT_NAMES)


@dataclass
class Use:
    gpus: int = 0
    jobs: int = 0
    gpu_seconds: float = 0.0       # in the scope's window

    @property
    def gpu_hours(self):
        return self.gpu_seconds / 3600

    def as_dict(self):
        return {"gpus": self.gpus, "jobs": self.jobs, "gpu_hours": round(self.gpu_hours, 3)}


def site_default():
    return Limits(
        gpus=settings.RINGMASTER_DEFAULT_QUOTA_GPUS,
        jobs=settings.RINGMASTER_DEFAULT_QUOTA_JOBS,
        gpus_per_job=settings.RINGMASTER_DEFAULT_QUOTA_GPUS_PER_JOB,
        gpu_hours=settings.RINGMASTER_DEFAULT_QUOTA_GPU_HOURS,
        window_days=settings.RINGMASTER_DEFAULT_QUOTA_WINDOW_DAYS,
        source="site default",
    )


def limits_of(row, base=None):
    """The limits of a Quota row; `base` fills its empty fields (None: they stay unlimited)."""
    if row is None:
        return base or Limits(window_days=settings.RINGMASTER_DEFAULT_QUOTA_WINDOW_DAYS, source="no quota")
    values, inherited = {}, False
    for name in LIMIT_NAMES:
        value = getattr(row, name)
        if value is None and base is not None and getattr(base, name) is not None:
            value, inherited = getattr(base, name), True
        values[name] = value
    window = row.window_days or (base.window_days if base else settings.RINGMASTER_DEFAULT_QUOTA_WINDOW_DAYS)
    return Limits(**values, window_days=window, source="quota and site default" if inherited else "quota")


class QuotaBook:
    """Quota rows and current use, read once: for one admission pass, one page, one answer.

    `users` / `groups` (ids) narrow what is read to the scopes of those users and groups;
    None reads everything (the scheduler). Use is read lazily and at most once per kind.
    """

    def __init__(self, *, users=None, groups=None, now=None):
        self.now = now or timezone.now()
        self._narrow = users is not None or groups is not None
        self._users, self._groups = list(users or []), list(groups or [])
        rows = Quota.objects.select_related("user", "group")
        if self._narrow:
            rows = rows.filter(Q(user_id__in=self._users) | Q(group_id__in=self._groups))
        self.rows = {("user" if r.user_id else "group", r.user_id or r.group_id, r.backend): r for r in rows}
        self.site = site_default()
        self._active = None
        self._backend_gpus = None
        self._windows = {}
        self._admitted = defaultdict(lambda: [0, 0])
        self._constraints = {}

    # --- which scopes and limits ------------------------------------------------------------
    def constraints(self, owner_id, owner_name, group_id, group_name, backend):
        """[(Scope, Limits)] that a job of this owner, group and backend must satisfy (the same
        list object for the same owner, group and backend: do not change it)."""
        key = (owner_id, group_id, backend)
        if key not in self._constraints:
            self._constraints[key] = self._find_constraints(owner_id, owner_name, group_id, group_name, backend)
        return self._constraints[key]

    def _find_constraints(self, owner_id, owner_name, group_id, group_name, backend):
        found = [(Scope("user", owner_id, owner_name), limits_of(self.rows.get(("user", owner_id, "")), self.site))]
        row = self.rows.get(("user", owner_id, backend))
        if row is not None:
            found.append((Scope("user", owner_id, owner_name, backend), limits_of(row)))
        if group_id is not None:
            for scope_backend in ("", backend):
                row = self.rows.get(("group", group_id, scope_backend))
                if row is not None:
                    found.append((Scope("group", group_id, group_name, scope_backend), limits_of(row)))
        return found

    # --- use ----------------------------------------------------------------------------------
    def _jobs(self):
        jobs = Job.objects.all()
        if self._narrow:
            jobs = jobs.filter(Q(owner_id__in=self._users) | Q(charged_group_id__in=self._groups))
        return jobs

    @staticmethod
    def _keys(owner_id, group_id, backend):
        keys = [("user", owner_id, ""), ("user", owner_id, backend)]
        if group_id is not None:
            keys += [("group", group_id, ""), ("group", group_id, backend)]
        return keys

    def _load_active(self):
        active, by_backend = defaultdict(lambda: [0, 0]), defaultdict(int)
        rows = (Job.objects.filter(state__in=ACTIVE_STATES).order_by()
                .values_list("owner_id", "charged_group_id", "backend")
                .annotate(gpus=Sum(in_use_expression()), jobs=Count("id")))
        for owner_id, group_id, backend, gpus, jobs in rows:
            by_backend[backend] += gpus
            for key in self._keys(owner_id, group_id, backend):
                active[key][0] += gpus
                active[key][1] += jobs
        self._active, self._backend_gpus = active, by_backend

    def _window_seconds(self, days):
        """{scope key: GPU-seconds} over the last `days` days, running jobs up to now."""
        if days not in self._windows:
            since = self.now - timedelta(days=days)
            ran = ExpressionWrapper(
                Coalesce("finished_at", Value(self.now)) - Greatest("started_at", Value(since)),
                output_field=DurationField(),
            )
            overlapping = (self._jobs().filter(started_at__isnull=False, started_at__lt=self.now)
                           .filter(Q(finished_at__isnull=True) | Q(finished_at__gt=since)).order_by())
            rows = (overlapping.exclude(accounting.sized_over_time())
                    .values_list("owner_id", "charged_group_id", "backend", "gpus")
                    .annotate(ran=Sum(ran)))
            seconds = defaultdict(float)
            for owner_id, group_id, backend, gpus, duration in rows:
                value = max(duration.total_seconds(), 0.0) * gpus if duration else 0.0
                for key in self._keys(owner_id, group_id, backend):
                    seconds[key] += value
            # Elastic and requeued jobs count the size they had over time (few: read one by one).
            elastic = list(overlapping.filter(accounting.sized_over_time()).values_list(
                "pk", "owner_id", "charged_group_id", "backend", "gpus", "started_at", "finished_at"))
            changes = accounting.size_changes(row[0] for row in elastic)
            for pk, owner_id, group_id, backend, gpus, started, finished in elastic:
                value = sum((min(b, self.now) - max(a, since)).total_seconds() * size
                            for a, b, size in accounting.segments(started, finished or self.now, gpus, changes[pk])
                            if b > since)
                for key in self._keys(owner_id, group_id, backend):
                    seconds[key] += value
            self._windows[days] = seconds
        return self._windows[days]

    def use(self, scope, limits=None, *, hours=None):
        """Use of `scope`; GPU-hours are read when the limits have a GPU-hour limit, or `hours`."""
        if self._active is None:
            self._load_active()
        gpus, jobs = self._active.get(scope.key, (0, 0))
        extra = self._admitted.get(scope.key, (0, 0))
        use = Use(gpus=gpus + extra[0], jobs=jobs + extra[1])
        days = limits.window_days if limits else self.site.window_days
        if hours or (hours is None and limits is not None and limits.gpu_hours is not None):
            use.gpu_seconds = self._window_seconds(days).get(scope.key, 0.0)
        return use

    def backend_gpus(self, backend):
        """GPUs of launching and running jobs on `backend`, everyone's."""
        if self._backend_gpus is None:
            self._load_active()
        return self._backend_gpus.get(backend, 0)

    def charge(self, constraints, gpus, backend):
        """Count a job admitted during this pass."""
        if self._active is None:
            self._load_active()
        for scope, _ in constraints:
            self._admitted[scope.key][0] += gpus
            self._admitted[scope.key][1] += 1
        self._backend_gpus[backend] += gpus

    def resize(self, constraints, delta, backend):
        """Count a change of `delta` GPUs of an admitted (elastic) job during this pass."""
        if self._active is None:
            self._load_active()
        for scope, _ in constraints:
            self._admitted[scope.key][0] += delta
        self._backend_gpus[backend] += delta

    # --- the rules ----------------------------------------------------------------------------
    @staticmethod
    def never_fits(constraints, gpus):
        """Why a job of `gpus` GPUs can never start under these limits (a "never_quota" Wait), or None."""
        for scope, limits in constraints:
            per_job = per_job_limit([(scope, limits)])
            if per_job is not None and gpus > per_job:
                return Wait("never_quota", name=scope.name, quota=scope.quota_label, limit="gpus_per_job", most=per_job)
            if limits.jobs == 0:
                return Wait("never_quota", name=scope.name, quota=scope.quota_label, limit="jobs")
            if limits.gpu_hours == 0:
                return Wait("never_quota", name=scope.name, quota=scope.quota_label, limit="gpu_hours",
                            days=limits.window_days)
        return None

    def growth_room(self, constraints, size):
        """How many more GPUs a running job of `size` GPUs may take under these limits (its
        GPUs at once and per job, and none once GPU-hours are used up); None: no limit."""
        room = None
        for scope, limits in constraints:
            if limits.unlimited:
                continue
            use = self.use(scope, limits)
            if limits.gpu_hours is not None and use.gpu_hours >= limits.gpu_hours:
                return 0
            for cap in (limits.gpus - use.gpus if limits.gpus is not None else None,
                        limits.gpus_per_job - size if limits.gpus_per_job is not None else None):
                if cap is not None:
                    room = max(cap, 0) if room is None else min(room, max(cap, 0))
        return room

    def blockers(self, constraints, gpus):
        """[(Scope, the limit it breaks)] for every scope whose limits a job of `gpus` GPUs would
        break now; the limit as the params of one scope of a "quota" Wait."""
        found = []
        for scope, limits in constraints:
            if limits.unlimited:
                continue
            use = self.use(scope, limits)
            if limits.gpu_hours is not None and use.gpu_hours >= limits.gpu_hours:
                found.append((scope, {"scope": str(scope), "limit": "gpu_hours", "use": use.gpu_hours,
                                      "most": limits.gpu_hours, "days": limits.window_days}))
            elif limits.jobs is not None and use.jobs + 1 > limits.jobs:
                found.append((scope, {"scope": str(scope), "limit": "jobs", "use": use.jobs, "most": limits.jobs}))
            elif limits.gpus is not None and use.gpus + gpus > limits.gpus:
                found.append((scope, {"scope": str(scope), "limit": "gpus", "use": use.gpus, "most": limits.gpus,
                                      "needs": gpus}))
        return found


def per_job_limit(constraints):
    """The most GPUs one job may ask for under these limits (its per-job limits and GPUs at
    once, whichever is less, over every scope); None: no such limit."""
    found = [limit for _, limits in constraints for limit in (limits.gpus_per_job, limits.gpus) if limit is not None]
    return min(found) if found else None


# --- a user's view ------------------------------------------------------------------------------
def groups_of(user):
    return list(user.groups.order_by("name"))


def default_group(user, groups=None):
    """The group a job is charged to when it names none: the user's chosen default group if
    they still belong to it, else their first group by name; None for a user in no group."""
    groups = groups_of(user) if groups is None else groups
    if not groups:
        return None
    chosen = UserSettings.objects.filter(user=user).values_list("default_group_id", flat=True).first()
    return next((group for group in groups if group.pk == chosen), groups[0])


def refusal(user, group, backend, gpus):
    """Why a job can never start for this user, group and backend (a message naming the limit)."""
    book = QuotaBook(users=[user.pk], groups=[group.pk] if group else [])
    constraints = book.constraints(user.pk, user.get_username(), group.pk if group else None,
                                   group.name if group else "", backend)
    never = book.never_fits(constraints, gpus)
    return refusal_words(never) if never else None


def parallel_refusal(user, group, backend, gpus, parallel):
    """Why `parallel` jobs of `gpus` GPUs each can never run at once for this user, group and
    backend (a study's trials at once), naming the limit; None where they can."""
    book = QuotaBook(users=[user.pk], groups=[group.pk] if group else [])
    constraints = book.constraints(user.pk, user.get_username(), group.pk if group else None,
                                   group.name if group else "", backend)
    for scope, limits in constraints:
        if limits.jobs is not None and parallel > limits.jobs:
            return f"At most {limits.jobs} jobs at once under the {scope.quota_label} of {scope.name}."
        if limits.gpus is not None and parallel * gpus > limits.gpus:
            return (f"{parallel} trials of {gpus} GPUs need {parallel * gpus} GPUs at once; the "
                    f"{scope.quota_label} of {scope.name} allows {limits.gpus}.")
    return None


def largest_jobs(user, groups, backend_names):
    """{(group name or "", backend name): the most GPUs one job of `user` charged to that group
    (or to none) may ask for on that backend, or None}: what refusal() allows, for the job form."""
    book = QuotaBook(users=[user.pk], groups=[g.pk for g in groups])
    found = {}
    for group in list(groups) or [None]:
        for backend in backend_names:
            constraints = book.constraints(user.pk, user.get_username(), group.pk if group else None,
                                           group.name if group else "", backend)
            found[(group.name if group else "", backend)] = per_job_limit(constraints)
    return found


def summary(user):
    """The caller's limits and current use, scope by scope (GET /api/quota/, the pages)."""
    groups = groups_of(user)
    charged = default_group(user, groups)
    book = QuotaBook(users=[user.pk], groups=[g.pk for g in groups])
    name = user.get_username()
    scopes = [(Scope("user", user.pk, name), limits_of(book.rows.get(("user", user.pk, "")), book.site))]
    for backend in sorted(b for (kind, ident, b) in book.rows if kind == "user" and b):
        scopes.append((Scope("user", user.pk, name, backend), limits_of(book.rows[("user", user.pk, backend)])))
    for group in groups:
        for backend in sorted(b for (kind, ident, b) in book.rows if kind == "group" and ident == group.pk):
            scopes.append((Scope("group", group.pk, group.name, backend),
                           limits_of(book.rows[("group", group.pk, backend)])))
    listed = []
    for scope, limits in scopes:
        use = book.use(scope, limits, hours=True)
        listed.append({
            "scope": scope.kind, "name": scope.name, "backend": scope.backend or None,
            "source": limits.source, "limits": limits.as_dict(), "use": use.as_dict(),
            "lines": describe(limits, use),
        })
    return {
        "user": user.get_username(),
        "groups": [g.name for g in groups],
        "default_group": charged.name if charged else None,
        "limits": listed[0]["limits"],
        "use": listed[0]["use"],
        "scopes": listed,
        "storage": artifacts.storage_summary(user),
    }


def describe(limits, use):
    """Plain lines: "GPUs at once: 2 of 8", "GPU-hours (30 days): 12.5 of 1,000"."""
    def of(value, limit):
        return f"{value} of {limit}" if limit is not None else f"{value} (no limit)"
    lines = [
        f"GPUs at once: {of(use.gpus, limits.gpus)}",
        f"jobs at once: {of(use.jobs, limits.jobs)}",
        f"GPUs per job: {'at most ' + str(limits.gpus_per_job) if limits.gpus_per_job is not None else 'no limit'}",
        f"GPU-hours ({limits.window_days} days): "
        + of(number(use.gpu_hours), number(limits.gpu_hours) if limits.gpu_hours is not None else None),
    ]
    return lines


def describe_limits(limits):
    """"8 GPUs at once, 2 jobs at once, ..." ("no limits" when there are none)."""
    parts = []
    if limits.gpus is not None:
        parts.append(f"{limits.gpus} GPUs at once")
    if limits.jobs is not None:
        parts.append(f"{limits.jobs} jobs at once")
    if limits.gpus_per_job is not None:
        parts.append(f"at most {limits.gpus_per_job} GPUs per job")
    if limits.gpu_hours is not None:
        parts.append(f"{number(limits.gpu_hours)} GPU-hours per {limits.window_days} days")
    return ", ".join(parts) or "no limits"
