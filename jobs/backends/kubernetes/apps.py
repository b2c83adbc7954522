from django.apps import AppConfig
from django.db.models.signals import post_migrate


def drop_orphaned_queue_mappings(sender, using="default", **kwargs):
    """Queue mappings whose user or group was deleted while this app was not installed (its
    backend disabled): nothing removed them then (QueueMapping: no database constraint)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from jobs.backends.kubernetes.models import QueueMapping

    mappings = QueueMapping.objects.using(using)
    users = get_user_model().objects.using(using).values("pk")
    groups = Group.objects.using(using).values("pk")
    mappings.filter(user__isnull=False).exclude(user_id__in=users).delete()
    mappings.filter(group__isnull=False).exclude(group_id__in=groups).delete()


class KubernetesConfig(AppConfig):
    name = "jobs.backends.kubernetes"
    label = "kubernetes"
    verbose_name = "Kubernetes clusters"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        post_migrate.connect(drop_orphaned_queue_mappings, sender=self)
