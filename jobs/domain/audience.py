"""Whose line pushes anyone hears: a push that no web process would receive is not sent.

PUBLISH answers how many subscribers got a message. A job whose push reached none (nobody has
its page open) is marked unheard, and its next line pushes are left unsent, all but one every
PROBE_SECONDS (which finds a web process that subscribed again after losing Redis). A web process
that starts relaying a job says so at once, on its installation's "watching" group, after it has
subscribed and before its viewer reads the database (jobs.web.relay): the job is heard again, and
where pushes were left unsent meanwhile, one push says where the stored lines end, so that the
viewer reads what it lacks from the database. A viewer misses no line, and a job nobody watches
costs no PUBLISH a round: a training job's one-line rounds spent a sixth of the worker's CPU
encoding and publishing pushes nobody received (0.32 -> 0.04% of one core; BENCHMARKS.md §14).

Only line pushes are left out: changes of state and system samples are rare, and a viewer that
joins takes nothing of them from the database later.
"""
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

    def _would_send(self, group, now):
        since = self._unheard.get(group)
        return not (self.listening and since is not None and now - since < PROBE_SECONDS)

    def sent(self, pairs, receivers, token):
        """What PUBLISH answered for each of the pairs to_send returned (sent at `token`)."""
        sent_at = token
        with self._lock:
            for (group, _), count in zip(pairs, receivers):
                if count:
                    self._unheard.pop(group, None)
                    self._left_out.pop(group, None)
                elif self._noticed.get(group, -1.0) < sent_at:     # no relay came since it went out
                    self._unheard[group] = sent_at
            if sent_at - self._pruned > _KEEP_SECONDS:
                self._prune(sent_at)

    def noticed(self, group):
        """A web process relays `group` from now on: the last seq of what was left unsent (a
        push must say it), or None."""
        with self._lock:
            self._noticed[group] = self._clock()
            self._unheard.pop(group, None)
            return self._left_out.pop(group, None)

    def listen(self, listening):
        """Notices reach this process from now on (True), or may not (False). Either way what
        was learnt before may be stale: every job is heard again, and the groups whose pushes
        were left unsent are returned with their last seq (each needs a push)."""
        with self._lock:
            self.listening = listening
            left_out, self._left_out = self._left_out, {}
            self._unheard.clear()
            return left_out

    def _prune(self, now):
        self._pruned = now
        for marks in (self._unheard, self._noticed):
            for group in [group for group, at in marks.items() if now - at > _KEEP_SECONDS]:
                del marks[group]
                if marks is self._unheard:
                    self._left_out.pop(group, None)
