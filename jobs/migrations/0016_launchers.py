from django.db import migrations, models


class Migration(migrations.Migration):
    """A job's launcher (horovod or torchrun) and the launchers an image carries. A cluster's
    "launcher" (what an MPIJob's launcher pod runs) is renamed mpijob_command, so that "launcher"
    means one thing everywhere; torchrun jobs' TrainJobs reference the cluster's training runtime."""

    dependencies = [("jobs", "0015_instance_isolation")]

    operations = [
        migrations.RenameField("cluster", "launcher", "mpijob_command"),
        migrations.AlterField(
            model_name="cluster", name="mpijob_command",
            field=models.CharField(choices=[("mpirun", "mpirun --tag-output (as mpi-operator's examples)"),
                                            ("horovodrun", "horovodrun")],
                                   default="mpirun", max_length=20, verbose_name="MPIJob command",
                                   help_text="What the MPIJob's launcher pod runs to start a Horovod job's ranks.")),
        migrations.AddField(
            model_name="cluster", name="training_runtime",
            field=models.CharField(default="torch-distributed", max_length=253,
                                   help_text="The ClusterTrainingRuntime (Kubeflow Trainer) that torchrun jobs' "
                                             "TrainJobs reference.")),
        migrations.AddField(
            model_name="image", name="launchers",
            field=models.CharField(default="horovod", max_length=100,
                                   help_text="The launchers the image carries, comma-separated: horovod, torchrun.")),
        migrations.AlterField(
            model_name="image", name="python",
            field=models.CharField(default="python", max_length=300,
                                   help_text="Python interpreter (with Horovod or PyTorch) for the local and SSH backends.")),
        migrations.AddField(
            model_name="job", name="launcher",
            field=models.CharField(choices=[("horovod", "Horovod (horovodrun)"), ("torchrun", "PyTorch (torchrun)")],
                                   default="horovod", help_text="What starts the job's ranks.", max_length=20)),
    ]
