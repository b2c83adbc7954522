"""A backend with a model of its own that lives only in the tests: the proof that a backend's
folder holds everything that is its own (its model and migration, its admin page, its health
check, its table on the capacity page) and that enabling it is one setting.

Enabled for the whole test run by one line, `-p tests.modelbackend.enable` in pyproject.toml's
pytest options (enable.py puts `tests.modelbackend.backend.MachinesBackend` in
RINGMASTER_BACKENDS before Django's settings load, for this process and the services it
starts). portal.settings installs this package as a Django app because it is a backend's package
with an apps.py. Until a Machine row exists the backend takes no job, the job form does not
offer it and the capacity page leaves it out, so other tests see no difference.

The Backend class is in backend.py, not here: Django imports an app's package before its models
are ready, and a backend imports models.
"""
