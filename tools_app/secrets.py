"""Secrets: stored encrypted, referenced as `{{secret:NAME}}`, injected only at execution,
and redacted from every result, event, log and evidence row (ARCHITECTURE §7).

Redaction covers the exact value and the encodings a tool is likely to print it in
(base64 and URL-encoding); `StreamRedactor` also catches a value split across chunks.
"""

from __future__ import annotations

import base64
import re
from urllib.parse import quote, quote_plus

from django.db import transaction

from tenancy_app.crypto import decrypt, encrypt

from .models import Secret

SECRET_REF = re.compile(r"\{\{\s*secret:([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
MASK = "[REDACTED]"
MIN_REDACTABLE = 4  # shorter values would mask ordinary text everywhere


class MissingSecret(KeyError):
    pass


class SecretNotAllowed(ValueError):
    """A `{{secret:NAME}}` reference outside the fields a tool declares secret-capable."""

    def __init__(self, name: str, path: str, allowed: tuple[str, ...]):
        where = ", ".join(f"$.{f}" for f in allowed) if allowed else "none: this tool takes no secrets"
        super().__init__(
            f"the secret reference {{{{secret:{name}}}}} at {path} is not allowed: secrets are injected "
            f"only into this tool's secret-capable fields ({where}), never into other arguments "
            "such as file contents"
        )
        self.name, self.path = name, path


def set_secret(tenant, name: str, value: str) -> Secret:
    """Create or replace a tenant secret (the value is never stored in clear)."""
    if not value:
        raise ValueError("A secret needs a value.")
    with transaction.atomic():
        secret, _ = Secret.objects.update_or_create(
            tenant=tenant, name=name, defaults={"value_encrypted": encrypt(value)}
        )
    return secret


def tenant_secret_values(tenant_id: int) -> dict[str, str]:
    return {s.name: decrypt(s.value_encrypted) for s in Secret.objects.for_tenant(tenant_id)}


def resolve_refs(value, secrets: dict[str, str]):
    """Replace `{{secret:NAME}}` in a string (or in a dict's / list's strings) with the values."""
    if isinstance(value, str):

        def replace(match):
            name = match.group(1)
            if name not in secrets:
                raise MissingSecret(name)
            return secrets[name]

        return SECRET_REF.sub(replace, value)
    if isinstance(value, dict):
        return {k: resolve_refs(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_refs(v, secrets) for v in value]
    return value


def _references(value, path: str):
    """(name, json path) of every `{{secret:NAME}}` in the strings of `value`."""
    if isinstance(value, str):
        for match in SECRET_REF.finditer(value):
            yield match.group(1), path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _references(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _references(item, f"{path}[{index}]")


def inject_secret_fields(args: dict, secrets: dict[str, str], secret_fields: tuple[str, ...]) -> dict:
    """`args` with references resolved in the top-level `secret_fields` only (ARCHITECTURE §7).

    Raises MissingSecret for a name the tenant has not set, and SecretNotAllowed for a
    reference anywhere else: a secret must never be written out in plain text by, say, a
    file write.
    """
    found = [(key, ref) for key, value in args.items() for ref in _references(value, f"$.{key}")]
    for _, (name, _) in found:
        if name not in secrets:
            raise MissingSecret(name)
    for key, (name, path) in found:
        if key not in secret_fields:
            raise SecretNotAllowed(name, path, tuple(secret_fields))
    if not found:
        return args
    return {
        key: resolve_refs(value, secrets) if key in secret_fields else value for key, value in args.items()
    }


def _forms(value: str) -> set[str]:
    raw = value.encode()
    forms = {value, quote(value, safe=""), quote_plus(value)}
    for encoder in (base64.b64encode, base64.urlsafe_b64encode):
        encoded = encoder(raw).decode()
        forms.add(encoded)
        forms.add(encoded.rstrip("="))
    return {f for f in forms if len(f) >= MIN_REDACTABLE}


class Redactor:
    def __init__(self, values):
        forms: set[str] = set()
        for value in values:
            if value and len(value) >= MIN_REDACTABLE:
                forms |= _forms(value)
        self.forms = sorted(forms, key=len, reverse=True)
        self.pattern = re.compile("|".join(re.escape(f) for f in self.forms)) if self.forms else None
        self.longest = max((len(f) for f in self.forms), default=0)

    def __bool__(self) -> bool:
        return self.pattern is not None

    def redact(self, text: str) -> str:
        if self.pattern is None or not text:
            return text
        return self.pattern.sub(MASK, text)

    def redact_data(self, value):
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {k: self.redact_data(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.redact_data(v) for v in value]
        return value


class StreamRedactor:
    """Redacts a stream of chunks, holding back a tail so a value split across chunks is caught."""

    def __init__(self, redactor: Redactor):
        self.redactor = redactor
        self.pending = ""

    def feed(self, chunk: str) -> str:
        if not self.redactor:
            return chunk
        text = self.redactor.redact(self.pending + chunk)
        keep = self.redactor.longest - 1
        if keep <= 0 or len(text) <= keep:
            self.pending = text
            return ""
        self.pending = text[-keep:]
        return text[:-keep]

    def flush(self) -> str:
        text, self.pending = self.redactor.redact(self.pending), ""
        return text
