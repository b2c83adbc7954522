"""Pages about GPU use: "my usage", the staff capacity page, and the CSV export of usage."""
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse, HttpResponseBadRequest
from django.shortcuts import render

from jobs.domain import accounting, quotas, scheduler
from jobs import backends
from jobs.web.params import plain_digits, text_problem
from jobs.models import ACTIVE_STATES, Job, State

MAX_DAYS = 366
QUEUE_ON_PAGE = 200


class BadParameter(ValueError):
    pass


def _days(request, default=30):
    value = request.GET.get("days", "")
    if value == "":
        return default
    if not plain_digits(value) or not 1 <= int(value) <= MAX_DAYS:
        raise BadParameter(f"days: must be a whole number from 1 to {MAX_DAYS}.")
    return int(value)


def _bad(error):
    return HttpResponseBadRequest(str(error), content_type="text/plain; charset=utf-8")


@login_required
def my_usage(request):
    """The caller's limits and use now, and their GPU-hours per day, group and backend."""
    try:
        days = accounting.last_days(_days(request))
    except BadParameter as error:
        return _bad(error)
    usage = accounting.daily_usage(days[0], days[-1], jobs=Job.objects.filter(owner=request.user))
    per_day = accounting.totals(usage, ("day",))
    recent = list(Job.objects.filter(owner=request.user).select_related("charged_group")
                  .filter(started_at__isnull=False).order_by("-started_at", "-id")[:20])
    return render(request, "jobs/usage.html", {
        "quota": quotas.summary(request.user),
        "days": len(days),
        "by_day": [(day, per_day.get((day,), 0.0) / 3600) for day in reversed(days)],
        "by_group": _hours(accounting.totals(usage, ("group", "backend"))),
        "total_hours": sum(usage.values()) / 3600,
        "chart": accounting.series_by_group(usage, days),
        "recent": [(job, accounting.job_gpu_seconds(job) / 3600) for job in recent],
    })


def _hours(summed):
    return [(*key, seconds / 3600) for key, seconds in sorted(summed.items())]


@login_required
def capacity(request):
    """Staff: capacity and use per backend, quotas and their use, the queue with its reasons,
    and GPU-hours per group over time."""
    if not request.user.is_staff:
        raise PermissionDenied
    try:
        days = accounting.last_days(_days(request))
    except BadParameter as error:
        return _bad(error)
    book = quotas.QuotaBook()
    rows = []
    for backend in backends.enabled():
        active = Job.objects.filter(backend=backend.name, state__in=ACTIVE_STATES).count()
        queued = Job.objects.filter(backend=backend.name, state=State.QUEUED).count()
        capacity = backend.capacity()
        if capacity is None and not active and not queued:
            continue
        rows.append({"name": backend.name, "label": backend.label, "capacity": capacity,
                     "in_use": book.backend_gpus(backend.name), "active": active, "queued": queued})
    quota_rows = []
    for (kind, ident, backend), row in book.rows.items():
        name = row.user.get_username() if row.user_id else row.group.name
        scope = quotas.Scope(kind, ident, name, backend)
        limits = quotas.limits_of(row, book.site if kind == "user" and not backend else None)
        quota_rows.append((scope, limits, book.use(scope, limits, hours=True)))
    quota_rows.sort(key=lambda item: (item[0].kind != "group", item[0].name, item[0].backend))
    queue = scheduler.with_queue_position(
        Job.objects.filter(state=State.QUEUED).select_related("owner", "charged_group", "held_by")
        .order_by("held", "-priority", "created_at", "id"))[:QUEUE_ON_PAGE]
    usage = accounting.daily_usage(days[0], days[-1])
    return render(request, "jobs/capacity.html", {
        "backends": rows,
        "tables": [table for backend in backends.enabled() if (table := backend.capacity_table())],
        "site_default": quotas.describe_limits(book.site),
        "quota_rows": [(scope, limits, quotas.describe(limits, use)) for scope, limits, use in quota_rows],
        "queue": queue,
        "queued_total": Job.objects.filter(state=State.QUEUED).count(),
        "days": len(days),
        "by_group": _hours(accounting.totals(usage, ("group",))),
        "by_user": sorted(_hours(accounting.totals(usage, ("user",))), key=lambda row: -row[-1])[:20],
        "chart": accounting.series_by_group(usage, days),
    })


@login_required
def usage_csv(request):
    """GPU-hours per day, user, group and backend as CSV. Users get their own; staff get
    everyone's, or one user's (?user=) or one group's (?group=)."""
    try:
        days = accounting.last_days(_days(request))
        jobs = _csv_jobs(request)
    except BadParameter as error:
        return _bad(error)
    usage = accounting.daily_usage(days[0], days[-1], jobs=jobs)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="ringmaster-usage-{days[0]}-{days[-1]}.csv"'
    accounting.write_csv(usage, response)
    return response


def _csv_jobs(request):
    username, group_name = request.GET.get("user", ""), request.GET.get("group", "")
    for name, value in (("user", username), ("group", group_name)):
        if text_problem(value):
            raise BadParameter(f"{name}: {text_problem(value)}.")
    if not request.user.is_staff:
        if (username and username != request.user.get_username()) or group_name:
            raise BadParameter("user, group: only staff may export other users' usage.")
        return Job.objects.filter(owner=request.user)
    jobs = Job.objects.all()
    if username:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise BadParameter(f"user: no user {username!r}.")
        jobs = jobs.filter(owner=user)
    if group_name:
        group = Group.objects.filter(name=group_name).first()
        if group is None:
            raise BadParameter(f"group: no group {group_name!r}.")
        jobs = jobs.filter(charged_group=group)
    return jobs
