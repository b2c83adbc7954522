"""The instances' and the clusters' tables belong to their backends' apps (jobs.backends.instances,
jobs.backends.kubernetes), which take them over as they stand (their 0001, which runs first and
copies each job's cluster and artifacts instance). What the jobs app keeps of them goes: the two
columns of jobs_job, and the foreign key of a slot allocation, which keeps the host's id as a
plain column (a backend's app is installed only while the backend is enabled)."""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0020_artifacts'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RemoveField(model_name='job', name='cluster'),
                migrations.RemoveField(model_name='job', name='artifacts_instance'),
                migrations.AlterField(
                    model_name='slotallocation',
                    name='instance',
                    field=models.ForeignKey(blank=True, db_constraint=False, null=True,
                                            on_delete=django.db.models.deletion.PROTECT,
                                            related_name='allocations', to='jobs.instance'),
                ),
            ],
            state_operations=[
                migrations.RemoveField(model_name='queuemapping', name='cluster'),
                migrations.RemoveField(model_name='queuemapping', name='group'),
                migrations.RemoveField(model_name='queuemapping', name='user'),
                migrations.RemoveField(model_name='job', name='cluster'),
                migrations.RemoveField(model_name='job', name='artifacts_instance'),
                migrations.RemoveConstraint(model_name='slotallocation', name='slots_once_per_job_instance'),
                migrations.RemoveField(model_name='slotallocation', name='instance'),
                migrations.AddField(
                    model_name='slotallocation',
                    name='host_id',
                    field=models.BigIntegerField(blank=True, db_column='instance_id', null=True,
                                                 help_text="The backend's host row (an Instance); empty: this machine."),
                ),
                migrations.AddConstraint(
                    model_name='slotallocation',
                    constraint=models.UniqueConstraint(fields=('job', 'host_id'), name='slots_once_per_job_instance'),
                ),
                migrations.DeleteModel(name='Cluster'),
                migrations.DeleteModel(name='Instance'),
                migrations.DeleteModel(name='QueueMapping'),
            ],
        ),
    ]
