"""One heartbeat for all the jobs a worker process follows.

A follower keeps its claim on a job fresh (Job.follower_heartbeat) and looks, every couple of
seconds, whether the job was cancelled or ran past its time limit. Done by each follower, that
would be two queries a job every 2 s: a thousand queries a second for a worker following a
thousand jobs. So a worker process has one Heartbeat thread: every HEARTBEAT_SECONDS it refreshes
the claims of every job its followers hold in one UPDATE and reads what they check in one
SELECT; each follower looks at the latest reading of its own job, without a query.
"""
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from django.db import transaction
from django.utils import timezone

from jobs.domain import dbpool
from jobs.models import Job

log = logging.getLogger(__name__)
HEARTBEAT_SECONDS = 2


@dataclass(frozen=True)
class Reading:
    """What a beat read of one followed job."""
    held: bool                      # the claim is still this follower's (else: another took over)
    cancel_requested: bool
    started_at: Optional[datetime]
    time_limit_minutes: int
    at: float                       # time.monotonic() of the beat


class Heartbeat:
    def __init__(self, interval=HEARTBEAT_SECONDS):
        self.interval = interval
        self._lock = threading.Lock()
        self._followed = {}         # job id -> the follower id holding its claim
        self._readings = {}         # job id -> Reading
        self._thread = None

    def follow(self, job_id, me):
        """Keep `me`'s claim on the job fresh from now on."""
        with self._lock:
            self._followed[job_id] = me
            self._readings.pop(job_id, None)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="follow-heartbeat", daemon=True)
                self._thread.start()

    def forget(self, job_id, me=None):
        """Stop keeping the claim fresh; `me`: only if it is that follower's (a restarted job's next
        follower may follow it in this process already)."""
        with self._lock:
            if me is not None and self._followed.get(job_id) != me:
                return
            self._followed.pop(job_id, None)
            self._readings.pop(job_id, None)

    def reading(self, job_id):
        """The latest Reading of the job since it was followed; None before the first beat."""
        with self._lock:
            return self._readings.get(job_id)

    def _run(self):
        while True:
            time.sleep(self.interval)
            try:
                self.beat()
            except Exception:           # the next beat tries again; a claim left stale is re-attached
                log.exception("the followers' heartbeat failed")

    def beat(self):
        with self._lock:
            followed = dict(self._followed)
        if not followed:
            return
        at = time.monotonic()
        with dbpool.borrowed(), transaction.atomic():
            # A follower id names one follow of one job, so the two lists match pair by pair. The
            # rows are locked in id order first, as the followers' group writer locks them
            # (logbatch): two transactions that lock many job rows in different orders deadlock.
            held = Job.objects.filter(pk__anyof=list(followed), follower__anyof=list(followed.values()))
            locked = list(held.select_for_update().order_by("pk").values_list("pk", flat=True))
            Job.objects.filter(pk__anyof=locked).update(follower_heartbeat=timezone.now())
            rows = Job.objects.filter(pk__anyof=list(followed)).values_list(
                "pk", "follower", "cancel_requested", "started_at", "time_limit_minutes")
            readings = {pk: Reading(follower == followed[pk], cancel, started, limit, at)
                        for pk, follower, cancel, started, limit in rows}
        with self._lock:
            for job_id, me in followed.items():
                if self._followed.get(job_id) == me:        # not forgotten (or followed anew) meanwhile
                    self._readings[job_id] = readings.get(job_id) or Reading(False, False, None, 0, at)


_heartbeat = Heartbeat()


def follow(job_id, me):
    _heartbeat.follow(job_id, me)


def forget(job_id, me=None):
    _heartbeat.forget(job_id, me)


def reading(job_id):
    return _heartbeat.reading(job_id)
