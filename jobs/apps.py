from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Training jobs"

    def ready(self):
        from jobs import checks  # noqa: F401  (registers the system checks)
        from jobs import lookups  # noqa: F401  (registers field__anyof and jsonfield__has_tags)
        from jobs.domain import receivers  # noqa: F401  (connects the domain's signal receivers)
        from jobs.web import sso  # noqa: F401  (a sign-on through a provider sets the user's groups)
