"""This installation's id (jobs.models.Installation), read where a name outside the database is
made: RINGMASTER_INSTALLATION_ID if set, else the id kept in the database, made at random the
first time it is asked for."""
import re
import secrets

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction

from jobs.models import Installation

VALID = re.compile(r"[a-z0-9]{1,12}\Z")
_last_read = None           # what installation_id() last returned in this process


def new_ident():
    return secrets.token_hex(4)


def installation_id():
    global _last_read
    _last_read = _read()
    return _last_read


def last_read():
    """The id as this process last read it (read now if it never did): for names made too often
    to read the database each time (a followed job's live announcements), in a process that read
    it anew when it took the job up (jobs.backends.job_spec). Only a database reset while the
    process runs makes it stale."""
    return _last_read or installation_id()


def _read():
    configured = settings.RINGMASTER_INSTALLATION_ID
    if configured:
        if not VALID.match(configured):
            raise ImproperlyConfigured("RINGMASTER_INSTALLATION_ID must be 1 to 12 lowercase letters or digits")
        return configured
    row = Installation.objects.filter(pk=1).first()
    if row is None:
        try:
            with transaction.atomic():
                row = Installation.objects.create(pk=1, ident=new_ident())
        except IntegrityError:            # made at the same moment by another process
            row = Installation.objects.get(pk=1)
    return row.ident
