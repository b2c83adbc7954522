"""A pytest plugin (`-p tests.modelbackend.enable`), loaded before Django's settings: enables the
machines backend for the test run and for the worker and web server it starts (they inherit
RINGMASTER_BACKENDS from this environment)."""
import os

PATH = "tests.modelbackend.backend.MachinesBackend"
# portal.settings' default, where the environment names no backends.
DEFAULT = ("jobs.backends.local.LocalBackend jobs.backends.instances.InstancesBackend "
           "jobs.backends.kubernetes.KubernetesBackend")

_paths = os.environ.get("RINGMASTER_BACKENDS", DEFAULT).replace(",", " ").split()
if PATH not in _paths:
    os.environ["RINGMASTER_BACKENDS"] = " ".join([*_paths, PATH])
