import django.core.validators
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [("jobs", "0019_notifications")]

    operations = [
        migrations.AddField(
            model_name="cluster",
            name="artifacts_volume",
            field=models.CharField(blank=True, help_text="A PersistentVolumeClaim in the job's namespace that its pods mount as RINGMASTER_OUTPUT_DIR, each job under a sub-path of its own name; empty: none.", max_length=253, validators=[django.core.validators.RegexValidator("^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "A PersistentVolumeClaim's name (DNS-1123).")]),
        ),
        migrations.AddField(
            model_name="job",
            name="artifacts_bytes",
            field=models.BigIntegerField(default=0, editable=False, help_text="Bytes of artifacts kept for the job (the storage quota)."),
        ),
        migrations.AddField(
            model_name="job",
            name="artifacts_deleted_at",
            field=models.DateTimeField(blank=True, editable=False, help_text="When retention deleted the job's artifacts.", null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="artifacts_instance",
            field=models.ForeignKey(blank=True, editable=False, help_text="The instance that ran the job's launcher: where its artifacts are brought back from.", null=True, on_delete=django.db.models.deletion.SET_NULL, related_name="+", to="jobs.instance"),
        ),
        migrations.AddField(
            model_name="job",
            name="artifacts_note",
            field=models.CharField(blank=True, editable=False, help_text="Why the job's artifacts were not all kept (over the storage quota).", max_length=500),
        ),
        migrations.AddField(
            model_name="job",
            name="checkpoint",
            field=models.CharField(blank=True, editable=False, help_text="A rerun from checkpoint: the parent's artifact it starts from (RINGMASTER_CHECKPOINT).", max_length=1024),
        ),
        migrations.AddField(
            model_name="job",
            name="checkpoint_pattern",
            field=models.CharField(blank=True, help_text="A glob (e.g. *.pt) naming the job's checkpoints among its artifacts; a rerun from checkpoint starts from the newest.", max_length=200),
        ),
        migrations.AddField(
            model_name="quota",
            name="storage_gb",
            field=models.FloatField(blank=True, help_text="A user's all-backends row: the artifacts of their jobs kept at once; empty: no limit.", null=True, validators=[django.core.validators.MinValueValidator(0)], verbose_name="artifact storage (GB)"),
        ),
    ]
