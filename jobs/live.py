"""Telling live viewers (websocket groups) about new lines, metric points and states.

Everything is stored before it is announced; a viewer that misses an announcement catches up
from the database with ?since=<seq>.
"""
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


def group_name(job_id):
    return f"job-{job_id}"


def _send(job_id, message):
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group_name(job_id), message)
    except Exception:  # a viewer's trouble must never fail the job; viewers resync from the DB
        log.warning("could not notify viewers of job %s", job_id, exc_info=True)


def publish_state(job):
    _send(job.pk, {"type": "job.state", "state": job.state, "reason": job.reason})


def publish_lines(job_id, last_seq):
    _send(job_id, {"type": "job.lines", "last_seq": last_seq})
