"""Encryption at rest for tenant secrets (model API keys, tool secrets) under XAGENT_SECRETS_KEY."""

from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


@lru_cache(maxsize=4)
def _fernet(key: str) -> Fernet:
    return Fernet(key.encode())


def encrypt(plaintext: str) -> str:
    return _fernet(settings.XAGENT_SECRETS_KEY).encrypt(plaintext.encode()).decode() if plaintext else ""


def decrypt(token: str) -> str:
    if not token:
        return ""
    try:
        return _fernet(settings.XAGENT_SECRETS_KEY).decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise ValueError("stored secret cannot be decrypted: XAGENT_SECRETS_KEY changed?") from exc
