"""The line pushes of a job nobody watches are left out, and none that a viewer needs
(jobs.domain.audience): the rule alone, on a clock of the test's own; and without Redis, a job
is watched while a viewer polls it."""
import time

import pytest

from jobs.domain import audience
from jobs.domain.audience import Audience, Pollers


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def push(last_seq):
    return {"type": "job.lines", "last_seq": last_seq, "after": last_seq - 1, "lines": "...", "metrics": None}


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def listening(clock):
    heard = Audience(clock)
    heard.listen(True)
    return heard


def send(heard, group, last_seq, receivers):
    """One announcement round of `group`'s push: whether it was sent."""
    pairs, token = heard.to_send([(group, push(last_seq))])
    heard.sent(pairs, [receivers] * len(pairs), token)
    return bool(pairs)


def test_after_a_push_nobody_heard_the_next_ones_wait_for_a_viewer_or_the_probe(listening, clock):
    assert send(listening, "job-a-1", 0, receivers=0)          # the first push finds nobody
    clock.now += 1
    assert not send(listening, "job-a-1", 1, receivers=0)
    assert send(listening, "job-a-2", 0, receivers=1)          # another job's pushes go on
    assert send(listening, "job-a-2", 1, receivers=1)
    clock.now += audience.PROBE_SECONDS
    assert send(listening, "job-a-1", 2, receivers=0)          # the probe: one every PROBE_SECONDS
    assert not send(listening, "job-a-1", 3, receivers=0)


def test_a_relay_that_comes_says_where_the_left_out_lines_end_and_hears_the_next(listening, clock):
    send(listening, "job-a-1", 0, receivers=0)
    assert not send(listening, "job-a-1", 5, receivers=0)
    assert not send(listening, "job-a-1", 9, receivers=0)
    assert listening.noticed("job-a-1") == 9                    # one push says: stored up to 9
    assert send(listening, "job-a-1", 10, receivers=1)
    assert listening.noticed("job-a-1") is None                 # nothing left out since


def test_a_notice_that_overtakes_the_answer_of_an_earlier_push_is_not_undone(listening, clock):
    """The push went out before the relay subscribed (nobody heard it) but its answer is read after
    the relay's notice: the job stays heard."""
    pairs, token = listening.to_send([("job-a-1", push(0))])
    clock.now += 0.001
    listening.noticed("job-a-1")
    listening.sent(pairs, [0], token)
    assert send(listening, "job-a-1", 1, receivers=1)


def test_every_push_goes_while_notices_may_not_come(clock):
    heard = Audience(clock)
    send(heard, "job-a-1", 0, receivers=0)
    assert send(heard, "job-a-1", 1, receivers=0)               # not listening yet
    heard.listen(True)
    send(heard, "job-a-1", 2, receivers=0)
    assert not send(heard, "job-a-1", 3, receivers=0)
    assert heard.listen(False) == {"job-a-1": 3}               # what lost listening owes viewers
    assert send(heard, "job-a-1", 4, receivers=0)


def test_changes_of_state_and_samples_always_go(listening):
    send(listening, "job-a-1", 0, receivers=0)
    state = {"type": "job.state", "state": "RUNNING", "reason": ""}
    sample = {"type": "job.system", "samples": [], "hint": ""}
    assert listening.to_send([("job-a-1", state), ("job-a-1", sample)])[0] == [("job-a-1", state), ("job-a-1", sample)]


def test_whether_a_push_would_go_is_known_before_it_is_made(listening, clock):
    """(Its lines are not encoded for a push that would be left out.)"""
    assert listening.would_send("job-a-1")
    send(listening, "job-a-1", 0, receivers=0)
    assert not listening.would_send("job-a-1")
    clock.now += audience.PROBE_SECONDS
    assert listening.would_send("job-a-1")


def test_a_follower_gathering_an_unheard_jobs_output_is_told_when_a_viewer_comes(listening, clock):
    """when_heard (jobs.domain.follow gathers an unheard job's output until it is told): kept
    only while the job's pushes would be left out, called once when a relay says it relays the
    job, a later one replacing an earlier one of the same job."""
    called = []
    assert not listening.when_heard("job-a-1", lambda: called.append("early"))    # heard: nothing kept
    send(listening, "job-a-1", 0, receivers=0)
    assert listening.when_heard("job-a-1", lambda: called.append("first"))
    assert listening.when_heard("job-a-1", lambda: called.append("second"))
    assert listening.when_heard("job-a-2", lambda: called.append("other")) is False
    listening.noticed("job-a-1")
    assert called == ["second"]
    listening.noticed("job-a-1")
    assert called == ["second"]                                  # once


def test_a_follower_is_told_when_a_probe_is_heard_or_notices_may_no_longer_come(listening, clock):
    called = []
    for group in ("job-a-1", "job-a-2"):
        send(listening, group, 0, receivers=0)
        assert listening.when_heard(group, lambda group=group: called.append(group))
    clock.now += audience.PROBE_SECONDS
    assert not listening.when_heard("job-a-1", lambda: called.append("probe due"))   # its next push is sent
    send(listening, "job-a-1", 1, receivers=1)                   # the probe reached a viewer
    assert called == ["job-a-1"]
    listening.listen(False)                                      # every push is sent from now on
    assert called == ["job-a-1", "job-a-2"]


def test_what_was_kept_for_a_job_no_longer_unheard_is_dropped(listening, clock):
    send(listening, "job-a-1", 0, receivers=0)
    assert listening.when_heard("job-a-1", lambda: None)
    clock.now += audience._KEEP_SECONDS + 1
    send(listening, "job-a-2", 0, receivers=1)                   # a round that prunes
    assert listening._on_heard == {}


def test_without_redis_a_job_is_watched_while_a_viewer_looks_at_it_or_this_process_has_one(tmp_path):
    """Pollers: a push leaves no process, so the web process's viewers, which poll, leave a mark
    each time they look; a job is watched while one looked lately."""
    now = [time.time()]
    members = set()
    pollers = Pollers(members.__contains__, tmp_path / "viewers", clock=lambda: now[0])

    def never():
        raise AssertionError("a look in another process cannot ring a follower")

    assert pollers.when_heard("job-a-1", never)             # nobody watches: gather
    pollers.looked("job-a-1")                               # a viewer in the web process looks
    assert not pollers.when_heard("job-a-1", never)
    assert pollers.when_heard("job-a-2", never)             # another job is not watched
    assert not pollers.would_send("job-a-1")                # its pushes still reach nobody here
    now[0] += Pollers.FRESH_SECONDS - 0.5                   # a look a little late
    assert not pollers.when_heard("job-a-1", never)
    now[0] += 1.0                                           # no look for longer: the viewer left
    assert pollers.when_heard("job-a-1", never)
    pollers.looked("job-a-1")                               # it looks again
    now[0] = time.time()
    assert not pollers.when_heard("job-a-1", never)
    members.add("job-a-2")                                  # a viewer in this very process
    assert pollers.would_send("job-a-2") and not pollers.when_heard("job-a-2", never)
