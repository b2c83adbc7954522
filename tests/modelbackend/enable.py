"""A pytest plugin (`-p tests.modelbackend.enable`), loaded before Django's settings: enables the
machines backend for the test run and for the worker and web server it starts (they inherit
RINGMASTER_BACKENDS from this environment), beside the backends the environment names: the
default ones where it names none ("+" adds to them, portal.settings.enabled_backends)."""
import os

PATH = "tests.modelbackend.backend.MachinesBackend"

_value = os.environ.get("RINGMASTER_BACKENDS", "").strip()
if PATH not in _value.replace(",", " ").replace("+", " ").split():
    os.environ["RINGMASTER_BACKENDS"] = f"{_value} {PATH}" if _value else f"+{PATH}"
