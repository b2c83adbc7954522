from django.apps import AppConfig


class MachinesConfig(AppConfig):
    name = "tests.modelbackend"
    label = "modelbackend"
    verbose_name = "Machines (test backend)"
    default_auto_field = "django.db.models.BigAutoField"
