"""Encryption of secrets kept in the database (SSH private keys, kubeconfigs).

Fernet (AES-128-CBC + HMAC-SHA256, from `cryptography`) with keys from the environment variable
RINGMASTER_FERNET_KEYS: one or more Fernet keys, comma separated. The first encrypts; all of
them decrypt, so a key can be rotated by putting the new one first. Without the variable
nothing secret can be stored: Ringmaster refuses rather than keep a secret in the clear or
under a key that lives next to the database. Make a key with

    python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"
"""
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

ENV_VAR = "RINGMASTER_FERNET_KEYS"


class SecretError(Exception):
    pass


def _fernet():
    keys = [k.strip() for k in (settings.RINGMASTER_FERNET_KEYS or "").split(",") if k.strip()]
    if not keys:
        raise ImproperlyConfigured(
            f"{ENV_VAR} is not set: secrets (SSH keys, kubeconfigs) cannot be stored or read without it. "
            'Make one with: python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"'
        )
    try:
        return MultiFernet([Fernet(k.encode()) for k in keys])
    except ValueError:
        raise ImproperlyConfigured(f"{ENV_VAR} must hold Fernet keys (32 url-safe base64-encoded bytes)") from None


def encrypt(text):
    return _fernet().encrypt(text.encode()).decode()


def decrypt(token, what="a stored secret", again="store it again"):
    """The secret, or SecretError saying what cannot be read and what an admin can do about it."""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except ImproperlyConfigured as exc:
        raise SecretError(f"{what} cannot be decrypted: {exc}") from None
    except InvalidToken:
        raise SecretError(
            f"{what} cannot be decrypted with the keys in {ENV_VAR} (they changed since it was stored): "
            f"put the key it was stored with back into {ENV_VAR}, after the new one, for web, worker and beat; "
            f"or {again}") from None
