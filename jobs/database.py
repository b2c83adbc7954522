"""Which database the portal stores to, decided in one place.

The engine's vendor is read from its class (Django's `load_backend`), not from a connection: a
follower thread asks before it borrows one of the few shared connections (jobs.domain.dbpool),
and asking `connection.vendor` would give that thread a connection object of its own.
"""
from functools import cache

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.utils import load_backend


@cache
def vendor():
    """The default database's vendor: "postgresql" in production, "sqlite" in a bare checkout."""
    return load_backend(connections.settings[DEFAULT_DB_ALIAS]["ENGINE"]).DatabaseWrapper.vendor


def on_postgresql():
    """Whether the portal stores to PostgreSQL (arrays as parameters, COPY, row locks)."""
    return vendor() == "postgresql"
