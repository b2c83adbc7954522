from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from jobs.domain import tokens


class Command(BaseCommand):
    help = "Print a new API token for a user (any earlier token of theirs stops working)."

    def add_arguments(self, parser):
        parser.add_argument("username")

    def handle(self, username, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        self.stdout.write(tokens.issue(user).key)
