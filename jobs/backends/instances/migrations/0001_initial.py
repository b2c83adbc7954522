"""The instances backend's tables as its own app's: Instance is taken over from the jobs app as it
stands in the database (table jobs_instance, state only), and the instance each job's artifacts
come back from moves out of the jobs_job row into ArtifactsHost."""
import django.db.models.deletion
from django.db import migrations, models


def copy_artifacts_hosts(apps, schema_editor):
    """Copy each job's artifacts instance from the column the jobs app had for it (artifacts_instance_id), where it has it
    still: this migration runs before jobs.0021 drops it (run_before); a later first install of the
    app finds none."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        columns = {column.name for column in connection.introspection.get_table_description(cursor, "jobs_job")}
        if "artifacts_instance_id" in columns:
            cursor.execute("INSERT INTO instances_artifactshost (job_id, instance_id) "
                           "SELECT id, artifacts_instance_id FROM jobs_job WHERE artifacts_instance_id IS NOT NULL")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('jobs', '0020_artifacts'),
    ]
    run_before = [
        ('jobs', '0021_backend_models'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel(
                name='Instance',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('name', models.CharField(max_length=100, unique=True)),
                    ('host', models.CharField(help_text='Host name or address; also what horovodrun -H uses.', max_length=255)),
                    ('port', models.PositiveIntegerField(default=22)),
                    ('user', models.CharField(max_length=100)),
                    ('gpus', models.PositiveIntegerField(help_text='Slots this instance offers.', verbose_name='GPUs')),
                    ('labels', models.CharField(blank=True, help_text='Comma-separated, e.g. a100,nvlink.', max_length=300)),
                    ('enabled', models.BooleanField(default=True)),
                    ('private_key_encrypted', models.TextField(blank=True, editable=False)),
                    ('host_key', models.CharField(blank=True, help_text='Recorded on first connection; clear it to accept a new host key.', max_length=2000)),
                    ('setup', models.CharField(blank=True, help_text='A /bin/sh line run before horovodrun, e.g. `. /opt/venv/bin/activate`.', max_length=1000)),
                    ('work_dir', models.CharField(default='.ringmaster/jobs', help_text="Where job directories go (relative: to the user's home). Must be the same path on every instance of a multi-host job.", max_length=500)),
                    ('peer_ssh_port', models.PositiveIntegerField(blank=True, help_text='horovodrun -p: SSH port between instances.', null=True)),
                    ('peer_ssh_key', models.CharField(blank=True, help_text='horovodrun -i: key file, on the instance, to reach the others.', max_length=500)),
                    ('network_interface', models.CharField(blank=True, help_text='horovodrun --network-interface (e.g. eth0).', max_length=50)),
                    ('healthy', models.BooleanField(default=False)),
                    ('health_reason', models.CharField(blank=True, default='not checked yet', max_length=500)),
                    ('health_checked_at', models.DateTimeField(blank=True, null=True)),
                    ('gpus_detected', models.IntegerField(blank=True, help_text='From nvidia-smi, where present.', null=True)),
                    ('gpu_inventory', models.JSONField(blank=True, default=list, editable=False, help_text='The GPUs the last health check saw: index, name, memory (MiB), uuid.')),
                    ('isolation', models.CharField(blank=True, choices=[('uid+bwrap', "each job under a uid of its own, with a private /tmp (bubblewrap): a job cannot read another job's files or signal its processes"), ('uid', "each job under a uid of its own: a job cannot read another job's files or signal its processes"), ('shared', "every job under the one SSH account (neither root nor allowed `sudo -n`), so jobs there can read each other's files and signal each other's processes")], default='', editable=False, help_text='How jobs run there, from what its account can do (last health check).', max_length=20)),
                ],
                options={
                    'db_table': 'jobs_instance',
                    'ordering': ['name'],
                },
            ),
        ]),
        migrations.CreateModel(
            name='ArtifactsHost',
            fields=[
                ('job', models.OneToOneField(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='artifacts_host', serialize=False, to='jobs.job')),
                ('instance', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='instances.instance')),
            ],
        ),
        migrations.RunPython(copy_artifacts_hosts, migrations.RunPython.noop),
    ]
