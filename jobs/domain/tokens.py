"""API tokens: one per user; a new one replaces the old, which stops working at once. The database
keeps only the SHA-256 of a key (a random 160 bits, so no slow hash is needed): the key is shown
once, to its user, when it is made, and never logged."""
import hashlib
import secrets

from django.db import transaction

from jobs.models import ApiToken


def digest(key):
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def current(user):
    return ApiToken.objects.filter(user=user).first()


def issue(user):
    """A new token for `user` (any earlier one of theirs stops working). Its `key`, set on the
    returned object only, is the one time the key exists outside its user's hands."""
    key = secrets.token_hex(20)
    with transaction.atomic():
        ApiToken.objects.filter(user=user).delete()
        token = ApiToken.objects.create(user=user, digest=digest(key))
    token.key = key
    return token


def revoke(user):
    """Whether `user` had a token (it works no more)."""
    deleted, _ = ApiToken.objects.filter(user=user).delete()
    return bool(deleted)


def user_for(key):
    """The active user whose token `key` is, or None."""
    token = ApiToken.objects.select_related("user").filter(digest=digest(key)).first() if key else None
    return token.user if token is not None and token.user.is_active else None
