from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Training jobs"

    def ready(self):
        from . import quotas  # noqa: F401  (connects its signal receivers)
