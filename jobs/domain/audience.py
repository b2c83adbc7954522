"""Whose line pushes anyone hears: a push that no web process would receive is not sent.

PUBLISH answers how many subscribers got a message. A job whose push reached none (nobody has
its page open) is marked unheard, and its next line pushes are left unsent, all but one every
PROBE_SECONDS (which finds a web process that subscribed again after losing Redis). A web process
that starts relaying a job says so at once, on its installation's "watching" group, after it has
subscribed and before its viewer reads the database (jobs.web.relay): the job is heard again, and
where pushes were left unsent meanwhile, one push says where the stored lines end, so that the
viewer reads what it lacks from the database. A viewer misses no line, and a job nobody watches
costs no PUBLISH a round: a training job's one-line rounds would otherwise spend part of what
following the job costs (BENCHMARKS.md, training) on encoding and publishing pushes nobody
receives.

Only line pushes are left out: changes of state and system samples are rare, and a viewer that
joins takes nothing of them from the database later.

A follower may gather what an unheard job prints before it reads on (jobs.domain.follow); it
asks to be told when the job is heard again (when_heard), so that the first viewer gets each
line as it comes.

Without Redis (Pollers) no push leaves its process, and viewers poll the database: a job is
watched where a viewer looked at it lately.
"""
import os
import threading
import time

PROBE_SECONDS = 5.0
_KEEP_SECONDS = 600.0           # an unheard job's mark is dropped this long after its last push


class Audience:
    """The bookkeeping of one process's publisher (thread-safe). Groups are jobs' group names."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self.listening = False      # notices reach this process (else every push is sent)
        self._unheard = {}          # group -> when a push of it last reached no one
        self._left_out = {}         # group -> the last seq of the pushes left unsent since
        self._noticed = {}          # group -> when a web process last said it relays the group
        self._on_heard = {}         # group -> called once when it is heard again (when_heard)
        self._pruned = clock()

    def to_send(self, messages):
        """The (group, message) pairs worth publishing, and a token for `sent`."""
        now = self._clock()
        kept = []
        with self._lock:
            for group, message in messages:
                if message.get("type") == "job.lines" and not self._would_send(group, now):
                    self._left_out[group] = max(self._left_out.get(group, -1), message["last_seq"])
                else:
                    kept.append((group, message))
        return kept, now

    def would_send(self, group):
        """Whether a line push of `group` would be sent now."""
        return self._would_send(group, self._clock())

    def when_heard(self, group, callback):
        """If a line push of `group` would be left out now: True, and `callback` is called once
        (from the thread that learns it) when the group is heard again, a web process saying it
        relays it or notices no longer reaching this process; one a group, a later one replacing
        it. Else False, and nothing is kept."""
        with self._lock:
            if self._would_send(group, self._clock()):
                return False
            self._on_heard[group] = callback
            return True

    def _heard_again(self, groups):
        """Call (outside the lock) what when_heard kept for `groups`, all of them if None."""
        with self._lock:
            if groups is None:
                calls, self._on_heard = list(self._on_heard.values()), {}
            else:
                calls = [call for call in map(self._on_heard.pop, groups, [None] * len(groups)) if call]
        for call in calls:
            call()

    def _would_send(self, group, now):
        since = self._unheard.get(group)
        return not (self.listening and since is not None and now - since < PROBE_SECONDS)

    def sent(self, pairs, receivers, token):
        """What PUBLISH answered for each of the pairs to_send returned (sent at `token`)."""
        sent_at = token
        heard = []
        with self._lock:
            for (group, _), count in zip(pairs, receivers):
                if count:
                    if self._unheard.pop(group, None) is not None:
                        heard.append(group)
                    self._left_out.pop(group, None)
                elif self._noticed.get(group, -1.0) < sent_at:     # no relay came since it went out
                    self._unheard[group] = sent_at
            if sent_at - self._pruned > _KEEP_SECONDS:
                self._prune(sent_at)
        if heard:
            self._heard_again(heard)

    def noticed(self, group):
        """A web process relays `group` from now on: the last seq of what was left unsent (a
        push must say it), or None."""
        with self._lock:
            self._noticed[group] = self._clock()
            self._unheard.pop(group, None)
            last_seq = self._left_out.pop(group, None)
        self._heard_again([group])
        return last_seq

    def listen(self, listening):
        """Notices reach this process from now on (True), or may not (False). Either way what
        was learnt before may be stale: every job is heard again, and the groups whose pushes
        were left unsent are returned with their last seq (each needs a push)."""
        with self._lock:
            self.listening = listening
            left_out, self._left_out = self._left_out, {}
            self._unheard.clear()
        self._heard_again(None)
        return left_out

    def _prune(self, now):
        self._pruned = now
        for marks in (self._unheard, self._noticed):
            for group in [group for group, at in marks.items() if now - at > _KEEP_SECONDS]:
                del marks[group]
                if marks is self._unheard:
                    self._left_out.pop(group, None)
        for group in [group for group in self._on_heard if group not in self._unheard]:
            del self._on_heard[group]           # a job that ended while its output was gathered


class Pollers:
    """Who watches a job without Redis (Channels' in-memory layer: make run's embedded default).

    A push reaches only the viewers of the process that sends it; a worker's reaches none. The web
    process's viewers poll the database every second instead (jobs.web.consumers), and each look
    leaves a mark: the time of a file in `marks` named after the job's group. A job is watched
    where this process has a viewer of it (`members(group)`) or one of its viewers looked within
    FRESH_SECONDS. Its follower gathers what it prints only while it is not (jobs.domain.follow):
    a watched job's line reaches its viewer at the viewer's next look, and the first viewer
    waits at most one gather more (a look in another process cannot ring the follower)."""

    FRESH_SECONDS = 3.0             # three looks: a look late on a busy machine is not a viewer gone

    def __init__(self, members, marks, clock=time.time):
        self._members = members
        self._marks = marks
        self._clock = clock

    def would_send(self, group):
        """Whether a push of `group` would reach anyone: only this process's viewers."""
        return self._members(group)

    def when_heard(self, group, callback):
        """True if nobody watches `group` now; `callback` is never called (see the class)."""
        return not (self._members(group) or self._looked_lately(group))

    def looked(self, group):
        """A viewer of `group` looked at what is stored (the web process, each poll)."""
        mark = self._marks / group
        try:
            os.utime(mark)
        except FileNotFoundError:
            self._marks.mkdir(parents=True, exist_ok=True)
            mark.touch()

    def _looked_lately(self, group):
        try:
            return self._clock() - (self._marks / group).stat().st_mtime < self.FRESH_SECONDS
        except FileNotFoundError:
            return False
