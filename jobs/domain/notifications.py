"""Notifications of a user's jobs: a job ended, waited long in the queue, or its GPUs sit idle.

A job's end is announced in the transaction that records it (the receiver of its JobEvent,
jobs.domain.receivers); long waits and idle GPUs are found by beat (check). Each kind is
announced once per job (JobNotice), to each of the owner's targets, by a delivery
(NotificationDelivery) that the task deliver_notification sends once the transaction commits,
retried with backoff while the trouble may pass. Each target's deliveries are its log.
"""
import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Subquery
from django.urls import reverse
from django.utils import timezone

from jobs import taskqueue
from jobs.domain import notify_send, telemetry
from jobs.models import (
    Job, JobNotice, NotificationDelivery, NotificationPreferences, NotificationTarget, State,
)
from jobs.secrets import SecretError

log = logging.getLogger(__name__)
Event = NotificationDelivery.Event
Status = NotificationDelivery.Status
KEEP_DAYS = 30            # how long a target's log keeps a delivery

_ENDED_WORDS = {State.SUCCEEDED: "succeeded", State.FAILED: "failed", State.CANCELLED: "was cancelled"}


def preferences(user_id):
    """The user's NotificationPreferences (unsaved defaults when they set none)."""
    return NotificationPreferences.objects.filter(user_id=user_id).first() or NotificationPreferences(user_id=user_id)


def _wants(prefs, event):
    return {Event.ENDED: prefs.on_end, Event.WAITING: prefs.on_wait, Event.IDLE: prefs.on_idle}[event]


def job_ended(job):
    """`job` has just ended (called in the transaction that ended it). Trouble here never stops
    a job from ending: it is logged, and what it began is rolled back to a savepoint."""
    try:
        with transaction.atomic():
            return announce(job, Event.ENDED)
    except Exception:
        log.exception("job %s: the notifications of its end could not be queued", job.pk)
        return []


def announce(job, event, prefs=None, now=None):
    """Tell `job`'s owner that `event` happened to it: once per job and kind, to each target,
    if they asked for it. Returns the deliveries queued."""
    targets = list(NotificationTarget.objects.filter(owner_id=job.owner_id).values_list("pk", flat=True))
    if not targets:
        return []
    prefs = prefs or preferences(job.owner_id)
    if not _wants(prefs, event):
        return []
    with transaction.atomic():
        _, first = JobNotice.objects.get_or_create(job_id=job.pk, kind=event)
        if not first:
            return []
        payload = describe(job, event, prefs, now)
        deliveries = NotificationDelivery.objects.bulk_create([
            NotificationDelivery(target_id=pk, job_id=job.pk, event=event, payload=payload) for pk in targets])
        for delivery in deliveries:
            taskqueue.deliver_notification(delivery.pk)
    return deliveries


def _when(moment):
    return moment.isoformat() if moment else None


def job_url(job_id):
    return settings.RINGMASTER_PUBLIC_URL.rstrip("/") + reverse("job-detail", args=[job_id])


def describe(job, event, prefs, now=None):
    """What a notification says: a title and a text for people, the job's facts for programs
    (the webhook's JSON body)."""
    now = now or timezone.now()
    name = job.display_name
    if event == Event.ENDED:
        title = f"{name} {_ENDED_WORDS.get(job.state, job.state.lower())}"
        detail = job.reason
    elif event == Event.WAITING:
        minutes = int((now - job.created_at).total_seconds() // 60)
        title = f"{name} has waited {minutes} minutes in the queue"
        detail = job.reason
    else:
        title = f"{name}'s GPUs are idle"
        detail = (f"Every GPU below {settings.RINGMASTER_NOTIFY_IDLE_BELOW_PERCENT:g}% utilization for "
                  f"{prefs.idle_minutes} minutes.")
    url = job_url(job.pk)
    return {
        "event": event,
        "title": title,
        "text": "\n".join(filter(None, [title + ".", detail, url])),
        "ts": _when(now),
        "job": {
            "id": job.pk, "name": job.name, "owner": job.owner.get_username(), "state": job.state,
            "reason": job.reason, "exit_code": job.exit_code, "failed_rank": job.failed_rank, "gpus": job.gpus,
            "backend": job.backend, "created_at": _when(job.created_at), "started_at": _when(job.started_at),
            "finished_at": _when(job.finished_at), "url": url,
        },
    }


def test_payload(target, now=None):
    title = "Ringmaster test notification"
    return {"event": Event.TEST, "title": title, "ts": _when(now or timezone.now()), "job": None,
            "text": f"{title}: notifications of your jobs reach {target} like this."}


def deliver(delivery_id, last=True):
    """One attempt at a delivery. Unsent (raised unless this is the `last` attempt) means: try
    again later. A delivery already settled, or whose target is gone, is left alone."""
    delivery = NotificationDelivery.objects.select_related("target").filter(pk=delivery_id).first()
    if delivery is None or delivery.status in (Status.DELIVERED, Status.FAILED):
        return delivery
    try:
        notify_send.send(delivery.target, delivery.event, delivery.payload, delivery.pk)
    except notify_send.Unsent as exc:
        _record(delivery, Status.FAILED if last else Status.RETRYING, str(exc))
        if not last:
            raise
    except (notify_send.Undeliverable, SecretError) as exc:
        _record(delivery, Status.FAILED, str(exc))
    else:
        _record(delivery, Status.DELIVERED, "")
    return delivery


def _record(delivery, status, detail):
    delivery.status, delivery.detail = status, detail[:500]
    delivery.attempts += 1
    delivery.save(update_fields=["status", "detail", "attempts", "updated_at"])


def send_test(target):
    """Send a test message to `target` now (one attempt) and log it; returns the delivery."""
    delivery = NotificationDelivery.objects.create(target=target, event=Event.TEST, payload=test_payload(target))
    return deliver(delivery.pk, last=True)


def last_deliveries(targets):
    """{target id: its latest delivery} for the queryset `targets`."""
    latest = NotificationDelivery.objects.filter(target=OuterRef("pk")).order_by("-id").values("pk")[:1]
    ids = [pk for pk in targets.annotate(last=Subquery(latest)).values_list("last", flat=True) if pk]
    return {delivery.target_id: delivery for delivery in NotificationDelivery.objects.filter(pk__in=ids)}


def _not_noticed(kind):
    return ~Exists(JobNotice.objects.filter(job=OuterRef("pk"), kind=kind))


def _with_targets():
    return Exists(NotificationTarget.objects.filter(owner=OuterRef("user")))


def check(now=None):
    """Beat's pass: announce jobs queued longer than their owners' wait, and running jobs whose
    GPUs sat idle for their owners' idle minutes; forget deliveries older than KEEP_DAYS."""
    now = now or timezone.now()
    announced = 0
    for prefs in NotificationPreferences.objects.filter(_with_targets(), on_wait=True):
        for job in Job.objects.select_related("owner").filter(
                _not_noticed(Event.WAITING), owner_id=prefs.user_id, state=State.QUEUED,
                created_at__lte=now - timedelta(minutes=prefs.wait_minutes)):
            announced += bool(announce(job, Event.WAITING, prefs, now))
    below = settings.RINGMASTER_NOTIFY_IDLE_BELOW_PERCENT
    for prefs in NotificationPreferences.objects.filter(_with_targets(), on_idle=True):
        since = now - timedelta(minutes=prefs.idle_minutes)
        for job in Job.objects.select_related("owner").filter(
                _not_noticed(Event.IDLE), owner_id=prefs.user_id, state=State.RUNNING, started_at__lte=since):
            if telemetry.gpus_idle(job.pk, since, below, now):
                announced += bool(announce(job, Event.IDLE, prefs, now))
    NotificationDelivery.objects.filter(created_at__lt=now - timedelta(days=KEEP_DAYS)).delete()
    return announced
