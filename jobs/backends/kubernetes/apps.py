from django.apps import AppConfig


class KubernetesConfig(AppConfig):
    name = "jobs.backends.kubernetes"
    label = "kubernetes"
    verbose_name = "Kubernetes clusters"
    default_auto_field = "django.db.models.BigAutoField"
