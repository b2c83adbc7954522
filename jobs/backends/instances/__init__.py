"""The instances backend (enabled as jobs.backends.instances.backend.InstancesBackend): horovodrun
and torchrun on interactive GPU instances over SSH (runners.ssh).

Its folder holds all that is its own: the backend (backend.py: placement, health checks, the
runner's hosts), its models, migrations and admin, the admin's form (forms.py), the add_instance
command and its capacity table. portal.settings installs the package as a Django app while the
backend is enabled. The Backend class is not imported here: Django imports an app's package
before its models are ready.
"""
