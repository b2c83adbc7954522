"""API tokens kept as the SHA-256 of their keys (jobs.ApiToken). The tokens of DRF's authtoken
table, which held keys in plain text, are carried over by their digests (they keep working) and
deleted there; that app is no longer installed, so its table is read, if it is there, by SQL."""
import datetime
import hashlib

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.utils import timezone
from django.utils.dateparse import parse_datetime

PLAIN = "authtoken_token"


def hash_plain_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if PLAIN not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("jobs", "ApiToken")
    table, key, user, created = (schema_editor.quote_name(name) for name in (PLAIN, "key", "user_id", "created"))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {key}, {user}, {created} FROM {table}")
        rows = cursor.fetchall()
        for plain, user_id, made in rows:
            if isinstance(made, str):                     # SQLite's raw column
                made = parse_datetime(made)
            if made is not None and timezone.is_naive(made):
                made = timezone.make_aware(made, datetime.timezone.utc)
            ApiToken.objects.update_or_create(user_id=user_id, defaults={
                "digest": hashlib.sha256(plain.encode("utf-8", "surrogateescape")).hexdigest()})
            if made is not None:
                ApiToken.objects.filter(user_id=user_id).update(created=made)
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA secure_delete = ON")    # the deleted keys' bytes overwritten in the file
        cursor.execute(f"DELETE FROM {table}")


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0023_image_limits'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='ApiToken',
            fields=[
                ('user', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True,
                                              related_name='api_token', serialize=False, to=settings.AUTH_USER_MODEL)),
                ('digest', models.CharField(max_length=64, unique=True)),
                ('created', models.DateTimeField(auto_now_add=True)),
            ],
        ),
        migrations.RunPython(hash_plain_tokens, migrations.RunPython.noop),
    ]
