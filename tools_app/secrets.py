"""Secrets: stored encrypted, referenced as `{{secret:NAME}}`, resolved only in configuration an
admin wrote, and redacted from every result, event, log and evidence row (ARCHITECTURE §7).

Where a reference is resolved: MCP server headers and env (`mcp.client`), a tool set's shell
environment for `shell_exec` (`shell_environment`), model configurations. Never in arguments the
model chose: `refuse_secret_references` turns any reference there into a tool error, whatever
the name (so the model cannot probe which secrets exist either).

Redaction covers the exact value and the forms a program is likely to print it in (base64,
URL-encoding, hex, reversed, spaced out); `StreamRedactor` also catches a value split across
chunks and `redact_byte_chunks` does the same for file bytes. A program given a secret can
always print a transformed copy these forms miss: that is why only admins choose which
programs get one.
"""

from __future__ import annotations

import base64
import codecs
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
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
    """A `{{secret:NAME}}` reference in arguments the model chose: never resolved (ARCHITECTURE §7)."""

    def __init__(self, name: str, path: str):
        super().__init__(
            f"the secret reference {{{{secret:{name}}}}} at {path} is not allowed: the model cannot "
            "reference secrets in tool arguments. Secrets are bound by admins, in a tool set's shell "
            "environment (for shell_exec) or in an MCP server's settings; a bound variable is already "
            'set in shell_exec\'s environment, so use it by its variable name (e.g. "$API_TOKEN")'
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


def refuse_secret_references(args: dict) -> None:
    """Raise SecretNotAllowed for the first `{{secret:NAME}}` anywhere in `args` (the model's).

    Whether the tenant has such a secret is not looked at: the answer is the same either way,
    so the model learns nothing about which secrets exist.
    """
    for key, value in args.items():
        for name, path in _references(value, f"$.{key}"):
            raise SecretNotAllowed(name, path)


@dataclass(frozen=True)
class BoundEnvironment:
    """`shell_exec`'s environment from the admin-written `shell_env` of a Session's tool sets,
    secrets resolved; `problem` says why it could not be built (then no call may run)."""

    env: dict[str, str] = field(default_factory=dict)
    problem: str = ""


def bound_shell_environment(tenant_id: int, toolset_names, secrets: dict[str, str]) -> BoundEnvironment:
    """Merge the `shell_env` of the named tool sets the tenant may use (global rows first, then
    the tenant's, each in name order: a later one wins a variable both bind) and resolve
    `{{secret:NAME}}` from this tenant's `secrets`. A reference to a secret the tenant has not
    set is a `problem` naming the tool set, never a partial environment."""
    from .models import ToolSet

    names = list(dict.fromkeys(toolset_names))
    if not names:
        return BoundEnvironment()
    rows = ToolSet.objects.for_tenant(tenant_id).filter(name__in=names).only("tenant_id", "name", "shell_env")
    env: dict[str, str] = {}
    for toolset in sorted(rows, key=lambda t: (t.tenant_id is not None, t.name)):
        for variable, template in (toolset.shell_env or {}).items():
            try:
                env[str(variable)] = resolve_refs(str(template), secrets)
            except MissingSecret as exc:
                return BoundEnvironment(
                    problem=f"the tool set {toolset.name!r} binds {variable} to the secret "
                    f"{exc.args[0]!r}, which this tenant has not set: an admin must set the secret "
                    "or change the tool set's shell environment"
                )
    return BoundEnvironment(env=env)


def tenant_redactor(tenant_id: int) -> Redactor:
    """A Redactor of every secret value of the tenant (empty, and free to apply, when it has none)."""
    return Redactor(tenant_secret_values(tenant_id).values())


def _forms(value: str) -> set[str]:
    raw = value.encode()
    forms = {value, quote(value, safe=""), quote_plus(value)}
    # Cheap transforms seen in attacks (`xxd -p`, `rev`, `sed 's/./& /g'`); arbitrary ones
    # (rot13, every other character, ...) cannot all be listed: see the module docstring.
    forms |= {raw.hex(), raw.hex().upper(), value[::-1], " ".join(value)}
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


def redact_byte_chunks(chunks: Iterable[bytes], redactor: Redactor) -> Iterator[bytes]:
    """File bytes with every secret form masked, chunk by chunk (a value split across chunks is
    still caught). Decoded as UTF-8 with `surrogateescape`, so bytes that are not UTF-8 pass
    through unchanged and a file without secrets comes out byte for byte."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
    stream = StreamRedactor(redactor)
    for chunk in chunks:
        text = stream.feed(decoder.decode(chunk))
        if text:
            yield text.encode("utf-8", "surrogateescape")
    text = stream.feed(decoder.decode(b"", final=True)) + stream.flush()
    if text:
        yield text.encode("utf-8", "surrogateescape")
