"""API tokens: one per user; a new one replaces the old, which stops working at once. The database
keeps only the SHA-256 of a key (a random 160 bits, so no slow hash is needed): the key is shown
once, to its user, when it is made, and never logged. A token stops working when it expires
(RINGMASTER_API_TOKEN_DAYS after it was made, unless made with another lifetime), when it is
revoked, and while its user is deactivated; a read-only one may only read."""
import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from jobs.models import ApiToken


def digest(key):
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def current(user):
    return ApiToken.objects.filter(user=user).first()


def issue(user, days=None, read_only=False):
    """A new token for `user` (any earlier one of theirs stops working), expiring after `days`
    (None: RINGMASTER_API_TOKEN_DAYS; 0: never). Its `key`, set on the returned object only, is
    the one time the key exists outside its user's hands."""
    days = settings.RINGMASTER_API_TOKEN_DAYS if days is None else days
    if days < 0:
        raise ValueError("days: a token's lifetime is 0 (never expires) or more days")
    key = secrets.token_hex(20)
    expires = timezone.now() + timedelta(days=days) if days else None
    with transaction.atomic():
        ApiToken.objects.filter(user=user).delete()
        token = ApiToken.objects.create(user=user, digest=digest(key), expires=expires, read_only=read_only)
    token.key = key
    return token


def revoke(user):
    """Whether `user` had a token (it works no more)."""
    deleted, _ = ApiToken.objects.filter(user=user).delete()
    return bool(deleted)


def working(key):
    """The token whose key is `key` while it works (not expired, its user active), or None."""
    token = ApiToken.objects.select_related("user").filter(digest=digest(key)).first() if key else None
    return token if token is not None and token.user.is_active and not token.expired else None


def user_for(key):
    """The active user whose working token `key` is, or None."""
    token = working(key)
    return token.user if token is not None else None
