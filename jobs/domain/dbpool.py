"""A few database connections shared by every job a worker process follows.

Django gives each thread a connection of its own, held for the thread's life. Were each followed
job (and the sampling of its hosts) to hold one, a worker following 50 jobs would hold 100
PostgreSQL connections: past max_connections (100 by default) the next follower could not
connect at all, and its job would go from follower to follower. So a follower thread borrows
one of RINGMASTER_FOLLOWER_DB_CONNECTIONS connections for each piece of database work (what one
event of its job asks for) and gives it back before it waits on its job again.

    with dbpool.borrowed():
        ...  # the ORM, transaction.atomic() and django.db.connection use the borrowed one

Borrowing is reentrant: a thread that holds one and borrows again keeps the one it holds.
"""
import contextlib
import queue
import threading

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

_held = threading.local()
_made = threading.Lock()
_pool = None


class Pool:
    def __init__(self, size, alias=DEFAULT_DB_ALIAS):
        self.size, self.alias = size, alias
        self._free = queue.LifoQueue()      # the last one given back is the one most likely still open
        for _ in range(size):
            self._free.put(None)            # opened when first used

    @contextlib.contextmanager
    def borrowed(self):
        if getattr(_held, "pool", None) is self:
            yield
            return
        wrapper = self._free.get()
        if wrapper is None:
            wrapper = connections.create_connection(self.alias)
            wrapper.inc_thread_sharing()    # it moves from thread to thread, one at a time
        own = _own_connection(self.alias)
        connections[self.alias] = wrapper
        _held.pool = self
        try:
            yield
        finally:
            _held.pool = None
            if own is None:
                del connections[self.alias]
            else:
                connections[self.alias] = own
            try:
                wrapper.close_if_unusable_or_obsolete()     # broken, or older than CONN_MAX_AGE
            finally:
                self._free.put(wrapper)

    def close_all(self):
        """Close the connections not borrowed now (each opens again when next borrowed)."""
        idle = []
        while True:
            try:
                idle.append(self._free.get_nowait())
            except queue.Empty:
                break
        for wrapper in idle:
            try:
                if wrapper is not None:
                    wrapper.close()
            finally:
                self._free.put(wrapper)


def _own_connection(alias):
    """The calling thread's own connection, if it opened one (Django keeps them thread-local)."""
    try:
        return getattr(connections._connections, alias)
    except AttributeError:
        return None


def pool():
    global _pool
    with _made:
        if _pool is None:
            _pool = Pool(settings.RINGMASTER_FOLLOWER_DB_CONNECTIONS)
        return _pool


def borrowed():
    return pool().borrowed()
