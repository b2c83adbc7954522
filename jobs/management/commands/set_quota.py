"""set_quota (--user U | --group G) [--gpus N] [--jobs N] [--gpus-per-job N]
[--gpu-hours H --window-days D] [--storage-gb N] [--backend B]

Creates or changes one quota row. A limit given as "default" is emptied (for a user: back to the
site default; for a group: no limit). Limits not given stay as they are.
"""
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from jobs import backends
from jobs.models import Quota
from jobs.domain.quotas import describe_limits, limits_of, site_default

LIMITS = [("gpus", int, "GPUs in use at once"), ("jobs", int, "jobs running at once"),
          ("gpus_per_job", int, "GPUs of one job"), ("gpu_hours", float, "GPU-hours in the window"),
          ("window_days", int, "length of the GPU-hours window in days"),
          ("storage_gb", float, "GB of artifacts a user's jobs keep at once (a user's all-backends row only)")]


def limit_parser(kind, name):
    def parse(text):
        if text.lower() in ("default", "none", ""):
            return None
        try:
            value = kind(text)
        except ValueError:
            raise ValueError(f"--{name.replace('_', '-')} must be a number or 'default', not {text!r}")
        if value < 0 or (name == "window_days" and value < 1):
            raise ValueError(f"--{name.replace('_', '-')} must be {'at least 1' if name == 'window_days' else '0 or more'}")
        return value
    return parse


class Command(BaseCommand):
    help = "Set the GPU quota of a user or a group (a team), on all backends or on one."

    def add_arguments(self, parser):
        who = parser.add_mutually_exclusive_group(required=True)
        who.add_argument("--user", help="username")
        who.add_argument("--group", help="group name (the limits are pooled across its members)")
        parser.add_argument("--backend", choices=backends.names(), default="",
                            help="limit use on this backend only (default: all backends together)")
        for name, kind, text in LIMITS:
            parser.add_argument(f"--{name.replace('_', '-')}", dest=name, metavar="N|default", help=text)

    def handle(self, *args, **options):
        values = {}
        for name, kind, _ in LIMITS:
            if options[name] is not None:
                try:
                    values[name] = limit_parser(kind, name)(options[name])
                except ValueError as exc:
                    raise CommandError(str(exc))
        lookup, label = self._who(options)
        if "storage_gb" in values and ("user" not in lookup or options["backend"]):
            raise CommandError("--storage-gb is a user's limit on all backends together: give --user, no --backend")
        with transaction.atomic():
            quota = Quota.objects.select_for_update().filter(**lookup, backend=options["backend"]).order_by().first()
            created = quota is None
            quota = quota or Quota(**lookup, backend=options["backend"])
            if values.get("gpu_hours") is not None and quota.window_days is None and "window_days" not in values:
                self.stderr.write(f"note: no --window-days; the site default of "
                                  f"{site_default().window_days} days applies")
            for name, value in values.items():
                setattr(quota, name, value)
            try:
                quota.full_clean()
            except ValidationError as exc:
                raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items()))
            quota.save()
        base = site_default() if quota.user_id and not quota.backend else None
        where = f" on {quota.backend}" if quota.backend else ""
        self.stdout.write(f"{'created' if created else 'updated'} quota of {label}{where}: "
                          f"{describe_limits(limits_of(quota, base))}"
                          + (f"; artifact storage {quota.storage_gb:g} GB" if quota.storage_gb is not None else ""))

    def _who(self, options):
        if options["user"] is not None:
            user = get_user_model().objects.filter(username=options["user"]).first()
            if user is None:
                raise CommandError(f"no user {options['user']!r}")
            return {"user": user}, f"user {user.get_username()}"
        group = Group.objects.filter(name=options["group"]).first()
        if group is None:
            raise CommandError(f"no group {options['group']!r} (create it in the admin first)")
        return {"group": group}, f"group {group.name}"
