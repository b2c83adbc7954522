"""API tokens (rest_framework.authtoken): one per user; a new one replaces the old, which
stops working at once. The key is shown once, to its user, and never logged."""
from django.db import transaction
from rest_framework.authtoken.models import Token


def current(user):
    return Token.objects.filter(user=user).first()


def issue(user):
    """A new token for `user` (any earlier one of theirs stops working)."""
    with transaction.atomic():
        Token.objects.filter(user=user).delete()
        return Token.objects.create(user=user)


def revoke(user):
    """Whether `user` had a token (it works no more)."""
    deleted, _ = Token.objects.filter(user=user).delete()
    return bool(deleted)
