"""System checks: what a deployment must set before it starts (manage.py migrate, check, runserver)."""
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
