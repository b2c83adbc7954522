from django.apps import AppConfig


class InstancesConfig(AppConfig):
    name = "jobs.backends.instances"
    label = "instances"
    verbose_name = "GPU instances"
    default_auto_field = "django.db.models.BigAutoField"
