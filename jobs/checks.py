"""System checks: what a deployment must set before it starts (manage.py migrate, check, runserver)."""
import os

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.security)
def fernet_keys_are_set(app_configs, **kwargs):
    if settings.RINGMASTER_FERNET_KEYS:
        return []
    return [checks.Error(
        "RINGMASTER_FERNET_KEYS is not set: with DATABASE_URL set, Ringmaster needs the Fernet key(s) that "
        "encrypt the SSH keys and kubeconfigs it stores, the same for web, worker and beat.",
        hint='Make one with: python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"',
        id="ringmaster.E001")]


@checks.register(checks.Tags.security)
def job_network_is_known_and_safe(app_configs, **kwargs):
    """RINGMASTER_JOB_NETWORK is one of runners.sandbox.NETWORKS; "host" is allowed, with a warning."""
    return _network_checks("RINGMASTER_JOB_NETWORK", "jobs on this machine share its network", ("E002", "E003", "W001"))


@checks.register(checks.Tags.security)
def install_network_is_known_and_safe(app_configs, **kwargs):
    """RINGMASTER_INSTALL_NETWORK (the sandbox of a local install of a project's packages): the same rules."""
    return _network_checks("RINGMASTER_INSTALL_NETWORK", "installs of projects' packages (which run code "
                                                         "from setup.py) share this machine's network",
                           ("E004", "E005", "W002"))


def _network_checks(name, who, ids):
    from runners.sandbox import NETWORKS

    network = getattr(settings, name)
    if network not in NETWORKS:
        return [checks.Error(f"{name} is {network!r}: it must be one of {', '.join(NETWORKS)}.",
                             id=f"ringmaster.{ids[0]}")]
    if network == "outbound" and os.geteuid() != 0:
        return [checks.Error(f"{name}=outbound needs a portal that runs as root: its jobs would not start.",
                             hint=f"Set {name}=none (no network), or run the worker as root.",
                             id=f"ringmaster.{ids[1]}")]
    if network == "host":
        return [checks.Warning(
            f"{name}=host: {who}, and reach the portal's "
            "database, Redis, broker and web server there.",
            hint="Use outbound (the default) or none, unless every user of this portal is trusted.",
            id=f"ringmaster.{ids[2]}")]
    return []
