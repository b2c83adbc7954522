"""The Celery app of the tests' workers: the portal's own, and one inspect command more.

`ringmaster_busy` answers what the worker is doing now: the tasks it runs or holds, and the
jobs its follow hub follows. A test's worker is drained before the test database is reset
(tests.conftest.Worker.drain): it takes no new task, and it is idle once this says so, so
nothing it does holds or waits for a lock while every table is truncated.
"""
from celery.worker import state
from celery.worker.control import inspect_command

from portal.celery import app

__all__ = ["app"]


@inspect_command()
def ringmaster_busy(worker_state):
    from jobs.domain.followhub import hub

    return {"tasks": sorted(request.id for request in [*state.active_requests, *state.reserved_requests]),
            "follows": hub.following()}
