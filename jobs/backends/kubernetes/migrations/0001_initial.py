"""The kubernetes backend's tables as its own app's: Cluster and QueueMapping are taken over from
the jobs app as they stand in the database (tables jobs_cluster and jobs_queuemapping, state
only), and each job's cluster moves out of the jobs_job row into ClusterJob."""
import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def copy_job_clusters(apps, schema_editor):
    """Copy each job's cluster from the column the jobs app had for it (cluster_id), where it has it
    still: this migration runs before jobs.0021 drops it (run_before); a later first install of the
    app finds none."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        columns = {column.name for column in connection.introspection.get_table_description(cursor, "jobs_job")}
        if "cluster_id" in columns:
            cursor.execute("INSERT INTO kubernetes_clusterjob (job_id, cluster_id) "
                           "SELECT id, cluster_id FROM jobs_job WHERE cluster_id IS NOT NULL")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('auth', '0012_alter_user_first_name_max_length'),
        ('jobs', '0020_artifacts'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    run_before = [
        ('jobs', '0021_backend_models'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel(
                name='Cluster',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('name', models.CharField(max_length=100, unique=True)),
                    ('enabled', models.BooleanField(default=True)),
                    ('connection', models.CharField(choices=[('kubeconfig', 'A kubeconfig (stored encrypted)'), ('in-cluster', "The portal's own service account (it runs in this cluster)")], default='kubeconfig', max_length=20)),
                    ('kubeconfig_encrypted', models.TextField(blank=True, editable=False)),
                    ('context', models.CharField(blank=True, help_text='kubeconfig context; empty: its current one.', max_length=200)),
                    ('namespace', models.CharField(default='default', help_text="Where MPIJobs go. {group} stands for the job's group (one namespace per group), e.g. team-{group}.", max_length=63)),
                    ('gpus_per_node', models.PositiveIntegerField(help_text='A job is split into workers of at most this many GPUs.', validators=[django.core.validators.MinValueValidator(1)], verbose_name='GPUs per node')),
                    ('node_selector', models.JSONField(blank=True, default=dict, help_text='For worker pods, e.g. {"gpu": "a100"}.')),
                    ('tolerations', models.JSONField(blank=True, default=list, help_text='For all pods, e.g. [{"key": "nvidia.com/gpu", "operator": "Exists"}].')),
                    ('priority_class', models.CharField(blank=True, help_text='priorityClassName of every pod.', max_length=253)),
                    ('kueue_queue', models.CharField(blank=True, help_text='Sets the kueue.x-k8s.io/queue-name label: Kueue admits the jobs. The default LocalQueue; groups and users may have their own (Kueue queues below).', max_length=63, verbose_name='Kueue queue')),
                    ('kueue_found', models.BooleanField(editable=False, help_text='Whether the last check found Kueue (its Workload kind) on the cluster; empty: not checked yet.', null=True, verbose_name='Kueue found')),
                    ('kueue_detail', models.CharField(blank=True, editable=False, help_text='What the last check found of Kueue.', max_length=300, verbose_name='Kueue check')),
                    ('mpijob_command', models.CharField(choices=[('mpirun', "mpirun --tag-output (as mpi-operator's examples)"), ('horovodrun', 'horovodrun')], default='mpirun', help_text="What the MPIJob's launcher pod runs to start a Horovod job's ranks.", max_length=20, verbose_name='MPIJob command')),
                    ('training_runtime', models.CharField(default='torch-distributed', help_text="The ClusterTrainingRuntime (Kubeflow Trainer) that torchrun jobs' TrainJobs reference.", max_length=253)),
                    ('artifacts_volume', models.CharField(blank=True, help_text="A PersistentVolumeClaim in the job's namespace that its pods mount as RINGMASTER_OUTPUT_DIR, each job under a sub-path of its own name; empty: none.", max_length=253, validators=[django.core.validators.RegexValidator('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$', "A PersistentVolumeClaim's name (DNS-1123).")])),
                    ('cpu_per_gpu', models.FloatField(default=4, validators=[django.core.validators.MinValueValidator(0.1)], verbose_name='CPUs per GPU')),
                    ('memory_per_gpu_gib', models.PositiveIntegerField(default=16, validators=[django.core.validators.MinValueValidator(1)], verbose_name='memory per GPU (GiB)')),
                    ('clean_pod_policy', models.CharField(choices=[('Running', 'Running: delete the workers still running when the job ends'), ('All', 'All: delete every worker when the job ends'), ('None', 'None: keep the workers')], default='Running', max_length=10)),
                    ('backoff_limit', models.PositiveIntegerField(default=0, help_text='Launcher retries after a failure (each retry is a new launcher pod).')),
                    ('ttl_seconds_after_finished', models.PositiveIntegerField(default=3600)),
                    ('image_pull_grace_seconds', models.PositiveIntegerField(default=300, help_text='A job whose image cannot be pulled fails after this long.')),
                    ('gpu_limit', models.PositiveIntegerField(blank=True, help_text="The most GPUs of this cluster's launching and running jobs together; more wait in Ringmaster's queue. Empty: no limit (the cluster's scheduler or Kueue queues them).", null=True, verbose_name='GPUs at once')),
                ],
                options={
                    'db_table': 'jobs_cluster',
                    'ordering': ['name'],
                },
            ),
            migrations.CreateModel(
                name='QueueMapping',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('queue', models.CharField(help_text='The kueue.x-k8s.io/queue-name label of these jobs.', max_length=63, verbose_name='LocalQueue')),
                    ('cluster', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='queue_mappings', to='kubernetes.cluster')),
                    ('group', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='auth.group')),
                    ('user', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to=settings.AUTH_USER_MODEL)),
                ],
                options={
                    'db_table': 'jobs_queuemapping',
                    'ordering': ['cluster__name', 'group__name', 'user__username'],
                    'constraints': [models.CheckConstraint(condition=models.Q(models.Q(('group__isnull', True), ('user__isnull', False)), models.Q(('group__isnull', False), ('user__isnull', True)), _connector='OR'), name='queue_mapping_user_xor_group', violation_error_message='Give a user or a group, not both.'), models.UniqueConstraint(condition=models.Q(('user__isnull', False)), fields=('cluster', 'user'), name='queue_mapping_once_per_cluster_user'), models.UniqueConstraint(condition=models.Q(('group__isnull', False)), fields=('cluster', 'group'), name='queue_mapping_once_per_cluster_group')],
                },
            ),
        ]),
        migrations.CreateModel(
            name='ClusterJob',
            fields=[
                ('job', models.OneToOneField(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='cluster_job', serialize=False, to='jobs.job')),
                ('cluster', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='cluster_jobs', to='kubernetes.cluster')),
            ],
        ),
        migrations.RunPython(copy_job_clusters, migrations.RunPython.noop),
    ]
