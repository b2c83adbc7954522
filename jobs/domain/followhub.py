"""Every job a worker process follows, driven by one event loop and a few threads.

A follow is a generator (follow._follow_to_end, telemetry.Sampler): each step does what its
job's runner has news for (stores the lines it printed, records a state) and ends where the
runner has nothing new, yielding the runner's Waiting: what to wait on. The hub's loop waits for
every follow at once (a Waiting's file descriptor, bell and timeout, on asyncio's selector and
timers) and runs the next step of a follow whose wait is over on one of a few step threads.

So a followed job costs no thread of its own: one worker process follows thousands, and a step
that blocks (a slow database, a host that answers late) holds one step thread for that time,
not the others' follows. What may block for long (a cancel waiting for a job's processes to go)
runs on a thread of its own (run_slow) while the follow waits for it without a step thread. A
launch never waits for the hub: it runs in the worker's task pool, and hands the launched job in.
"""
import asyncio
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings

log = logging.getLogger(__name__)
SLOW_THREADS = 64       # cancels under way at once (more wait their turn; no step thread waits)


class Following:
    """One follow in the hub: join() waits for its end."""

    def __init__(self, name, steps):
        self.name, self._steps = name, steps
        self._ended = threading.Event()

    def join(self, timeout=None):
        self._ended.wait(timeout)

    def is_alive(self):
        return not self._ended.is_set()

    def step(self):
        """Run the follow to its next wait: the Waiting it yielded, or None once it ended."""
        try:
            return next(self._steps)
        except StopIteration:
            return None
        except Exception:
            log.exception("%s: its follow failed", self.name)
            return None


class Hub:
    def __init__(self, threads):
        self.threads = threads
        self._lock = threading.Lock()
        self._loop = self._pool = self._thread = None
        self._pid = None
        self._slow = self._slow_pid = None
        self._following = set()

    def follow(self, name, steps):
        """Drive the generator `steps` to its end; returns its Following."""
        following = Following(name, steps)
        with self._lock:
            self._following.add(following)
        loop = self._running_loop()
        loop.call_soon_threadsafe(self._step, following)
        return following

    def following(self):
        """The names of the follows under way in this process (a job's is "job <id>")."""
        with self._lock:
            return sorted(following.name for following in self._following)

    def run_slow(self, call, *args):
        """Run a call that may block for long (a cancel waiting for a job's processes to go) on
        a thread of its own, not a step thread; its concurrent.futures.Future."""
        with self._lock:
            if self._slow is None or self._slow_pid != os.getpid():
                self._slow_pid = os.getpid()
                self._slow = ThreadPoolExecutor(SLOW_THREADS, thread_name_prefix="follow-slow")
            return self._slow.submit(call, *args)

    def _running_loop(self):
        """The hub's loop, started in this process (again, if its thread ever ended)."""
        with self._lock:
            if self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._loop = asyncio.new_event_loop()
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="follow-step")
                self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="follow-hub")
                self._thread.start()
            return self._loop

    # --- on the loop's thread -----------------------------------------------------------

    def _step(self, following):
        loop = self._loop
        future = self._pool.submit(following.step)
        future.add_done_callback(lambda done: loop.call_soon_threadsafe(self._stepped, following, done))

    def _stepped(self, following, done):
        try:
            waiting = done.result()
        except BaseException:                    # step() lets only what ends a thread through
            log.exception("%s: its follow ended", following.name)
            waiting = None
        if waiting is None:
            with self._lock:
                self._following.discard(following)
            following._ended.set()
        else:
            self._wait(following, waiting)

    def _wait(self, following, waiting):
        """Step `following` again once `waiting` is over: its fd readable, its bell rung or its
        time passed, whichever comes first."""
        loop = self._loop
        woken = False
        timer = None

        def wake():
            nonlocal woken
            if woken:
                return
            woken = True
            if waiting.fd is not None:
                loop.remove_reader(waiting.fd)
            if timer is not None:
                timer.cancel()
            if waiting.bell is not None:
                waiting.bell.forget()
            self._step(following)

        if waiting.fd is not None:
            try:
                loop.add_reader(waiting.fd, wake)
            except (OSError, ValueError):        # closed meanwhile: look at once
                loop.call_soon(self._step, following)
                return
        timer = loop.call_later(max(0.0, waiting.seconds), wake)
        if waiting.bell is not None:
            waiting.bell.listen(lambda: loop.call_soon_threadsafe(wake))


hub = Hub(settings.RINGMASTER_FOLLOW_THREADS)
