from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from jobs.domain import tokens


class Command(BaseCommand):
    help = ("Print a new API token for a user (any earlier token of theirs stops working). It expires "
            "after RINGMASTER_API_TOKEN_DAYS days unless --expires-days says otherwise.")

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--expires-days", type=int, default=None, metavar="N",
                            help=f"days until it stops working (0: never; default {settings.RINGMASTER_API_TOKEN_DAYS})")
        parser.add_argument("--read-only", action="store_true",
                            help="a token that may only read: anything but GET is refused (403)")

    def handle(self, username, expires_days=None, read_only=False, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        if expires_days is not None and expires_days < 0:
            raise CommandError("--expires-days: 0 (never expires) or more days")
        self.stdout.write(tokens.issue(user, days=expires_days, read_only=read_only).key)
