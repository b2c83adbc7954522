import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0018_job_tags_and_note"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='NotificationPreferences',
            fields=[
                ('user', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='notification_preferences', serialize=False, to=settings.AUTH_USER_MODEL)),
                ('on_end', models.BooleanField(default=True, help_text='Succeeded, failed or cancelled.', verbose_name='a job ends')),
                ('on_wait', models.BooleanField(default=False, help_text='Still queued after the minutes below.', verbose_name='a job waits long')),
                ('wait_minutes', models.PositiveIntegerField(default=30, validators=[django.core.validators.MinValueValidator(1)], verbose_name='waiting minutes')),
                ('on_idle', models.BooleanField(default=False, help_text="Running, with every GPU below the site's idle threshold for the minutes below.", verbose_name="a job's GPUs sit idle")),
                ('idle_minutes', models.PositiveIntegerField(default=30, validators=[django.core.validators.MinValueValidator(1)], verbose_name='idle minutes')),
            ],
            options={
                'verbose_name': 'notification preferences',
                'verbose_name_plural': 'notification preferences',
            },
        ),
        migrations.CreateModel(
            name='NotifyAllowedNetwork',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('network', models.CharField(help_text='An address range, e.g. 10.20.0.0/16 or fd00::/8.', max_length=50, unique=True)),
                ('note', models.CharField(blank=True, max_length=200)),
            ],
            options={
                'verbose_name': 'network allowed for notifications',
                'verbose_name_plural': 'networks allowed for notifications',
                'ordering': ['network'],
            },
        ),
        migrations.CreateModel(
            name='NotificationTarget',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(choices=[('email', 'E-mail'), ('apprise', 'Chat (an Apprise URL: Slack, Teams, Discord, ntfy, ...)'), ('webhook', 'Webhook (a signed JSON POST)')], max_length=10)),
                ('name', models.CharField(blank=True, max_length=100)),
                ('address_encrypted', models.TextField(editable=False)),
                ('secret_encrypted', models.TextField(blank=True, editable=False)),
                ('shown', models.CharField(editable=False, max_length=300)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('owner', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='notification_targets', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['owner', 'id'],
            },
        ),
        migrations.CreateModel(
            name='JobNotice',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(choices=[('ended', 'job ended'), ('waiting', 'job waits long'), ('idle', 'GPUs idle'), ('test', 'test')], max_length=10)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('job', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='jobs.job')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('job', 'kind'), name='job_notice_once_per_kind')],
            },
        ),
        migrations.CreateModel(
            name='NotificationDelivery',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('event', models.CharField(choices=[('ended', 'job ended'), ('waiting', 'job waits long'), ('idle', 'GPUs idle'), ('test', 'test')], max_length=10)),
                ('payload', models.JSONField(default=dict)),
                ('status', models.CharField(choices=[('queued', 'queued'), ('retrying', 'failed, will retry'), ('delivered', 'delivered'), ('failed', 'failed')], default='queued', max_length=10)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('detail', models.CharField(blank=True, max_length=500)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('job', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='jobs.job')),
                ('target', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='jobs.notificationtarget')),
            ],
            options={
                'ordering': ['-id'],
                'indexes': [models.Index(fields=['target', '-id'], name='delivery_target_newest')],
            },
        ),
    ]
