"""API tokens expire and may be read-only (jobs.ApiToken). The tokens made before get the site's
lifetime (RINGMASTER_API_TOKEN_DAYS) from now on, not from when they were made: a script that
uses one keeps working for that long after the upgrade."""
from datetime import timedelta

from django.conf import settings
from django.db import migrations, models
from django.utils import timezone


def expire_in_a_lifetime(apps, schema_editor):
    days = settings.RINGMASTER_API_TOKEN_DAYS
    if days:
        apps.get_model("jobs", "ApiToken").objects.filter(expires=None).update(
            expires=timezone.now() + timedelta(days=days))


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0028_sso_group'),
    ]

    operations = [
        migrations.AddField(
            model_name='apitoken',
            name='expires',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='apitoken',
            name='read_only',
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(expire_in_a_lifetime, migrations.RunPython.noop),
    ]
