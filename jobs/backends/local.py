"""The embedded default: horovodrun on the portal's own machine (runners.local)."""
from django.conf import settings

from jobs.backends.base import Backend, interpreter_problem
from runners.local import LocalRunner


class LocalBackend(Backend):
    name = "local"
    label = "This machine (horovodrun)"

    def capacity(self):
        return settings.RINGMASTER_LOCAL_GPUS

    def largest_job(self):
        return settings.RINGMASTER_LOCAL_GPUS

    def too_large(self, limit):
        return f"This machine runs at most {limit} processes per job."

    def image_problem(self, image):
        return interpreter_problem(image, "this machine")

    def runner(self, job):
        return LocalRunner(settings.RINGMASTER_JOBS_DIR)
