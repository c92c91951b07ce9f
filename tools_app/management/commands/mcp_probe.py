"""`manage.py mcp_probe [--header K=V]... [--oauth | --client-credentials ...] URL`: exercise a
Streamable HTTP MCP server with the product's own client (the code the admin action uses).

Lists the tools, calls each with arguments built from its input schema, prints what came back.
A server's elicitation is answered with the schema's defaults. Exit 0 when the exchange worked —
a tool answering with an error result is still a working exchange — and non-zero when
connecting or speaking MCP failed.

It is also an MCP client conformance client: the URL is the last argument, and with
`MCP_CONFORMANCE_SCENARIO` set (and `MCP_CONFORMANCE_CONTEXT` where the scenario gives
credentials) it authorizes as the scenario asks (`tools_app.mcp.probe_auth`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError

from tools_app.mcp.client import STREAMABLE_HTTP, Connection, ElicitAnswer, MCPError, probe
from tools_app.mcp.probe_auth import (
    AUTHORIZATION_CODE,
    CLIENT_CREDENTIALS,
    ProbeAuth,
    auth_for_scenario,
    provider_for,
)

from .mcp_server import parse_pairs

MAX_DEPTH = 8
RESULT_CHARS = 200


def arguments_for(schema: dict) -> dict:
    """Arguments satisfying an input schema: every required property, filled recursively."""
    value = example_value(schema or {}, schema or {}, 0)
    return value if isinstance(value, dict) else {}


def example_value(schema, root: dict, depth: int):
    """A simple value of the schema's type: "probe", 1, true, [], {} (required keys filled)."""
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return example_value(target, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        options = [o for o in schema.get(key) or [] if isinstance(o, dict) and o.get("type") != "null"]
        if options:
            return example_value(options[0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None and "properties" in schema:
        kind = "object"
    if kind == "string":
        return "probe"
    if kind in ("integer", "number"):
        return 1
    if kind == "boolean":
        return True
    if kind == "array":
        return []
    if kind == "object":
        properties = schema.get("properties") or {}
        return {
            name: example_value(properties.get(name, {}), root, depth + 1)
            for name in schema.get("required") or []
        }
    if kind == "null":
        return None
    return "probe"


def answer_with_defaults(message: str, schema: dict) -> ElicitAnswer:
    """Accept an elicitation with each property's `default` (SEP-1034); a required property
    without one gets the probe's example value, an optional one is left out."""
    properties = (schema or {}).get("properties") or {}
    required = set((schema or {}).get("required") or [])
    content = {}
    for name, prop in properties.items():
        if isinstance(prop, dict) and "default" in prop:
            content[name] = prop["default"]
        elif name in required:
            content[name] = example_value(prop, schema, 0)
    return ElicitAnswer(action="accept", content=content)


def one_line(text: str, limit: int = RESULT_CHARS) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class Command(BaseCommand):
    help = (
        "Connect to a Streamable HTTP MCP server with the product's MCP client, list its tools, "
        "call each with arguments built from its schema and print the results; elicitations are "
        "answered with the schema's defaults. With MCP_CONFORMANCE_SCENARIO set it acts as an MCP "
        "conformance client for that scenario."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--header", action="append", default=[], help="K=V sent with every request (repeatable)"
        )
        parser.add_argument("--timeout", type=float, default=30.0, help="seconds per step (default 30)")
        flow = parser.add_mutually_exclusive_group()
        flow.add_argument(
            "--oauth",
            action="store_true",
            help="authorize with OAuth (authorization code + PKCE) through the SDK's provider, headless: the "
            "authorization URL is fetched and the code read from its redirect, so this only works with "
            "authorization servers that approve without a person (test servers); tokens are kept in memory",
        )
        flow.add_argument(
            "--client-credentials",
            action="store_true",
            help="authorize with the OAuth client-credentials grant (needs --client-id and --client-secret "
            "or --private-key)",
        )
        parser.add_argument(
            "--client-id", default="", help="a pre-registered OAuth client ID (else: registration)"
        )
        parser.add_argument("--client-secret", default="", help="its secret")
        parser.add_argument(
            "--private-key", default="", help="PEM file: client credentials with private_key_jwt (RS256)"
        )
        parser.add_argument("--scope", default=None, help="OAuth scopes to ask for (space-separated)")
        parser.add_argument(
            "--client-metadata-url",
            default=None,
            help="HTTPS URL of this client's ID metadata document, used as its client ID where the "
            "authorization server supports those (else: dynamic registration)",
        )
        parser.add_argument(
            "--issuer", default=None, help="the authorization server client credentials belong to"
        )
        parser.add_argument("url")

    def handle(self, *args, url, header, timeout, **options):
        headers = parse_pairs(header, "--header")
        auth = self.probe_auth(options)
        try:
            authorizer = provider_for(url, auth, timeout) if auth else None
        except ValueError as exc:  # e.g. a client metadata URL that is not HTTPS
            raise CommandError(str(exc)) from None
        conn = Connection(
            server_name=urlsplit(url).hostname or url,
            transport=STREAMABLE_HTTP,
            url=url,
            headers=headers,
            timeout=timeout,
            # Header values are credentials as often as not: keep them out of error messages.
            secret_values=tuple(v for v in (*headers.values(), auth and auth.client_secret) if v),
            auth=authorizer,
        )
        elicited: list[tuple[str, ElicitAnswer]] = []
        lock = threading.Lock()

        def on_elicit(message: str, schema: dict) -> ElicitAnswer:
            answer = answer_with_defaults(message, schema)
            with lock:
                elicited.append((message, answer))
            return answer

        # The HTTP client logs every request at INFO, and the SDK's OAuth flow logs its failures
        # with a traceback: noise next to the probe's report, whose error names the failure.
        quiet = {"httpx2": logging.WARNING, "mcp.client.auth": logging.CRITICAL}
        levels = {name: logging.getLogger(name).level for name in quiet}
        if options["verbosity"] < 2:
            for name, level in quiet.items():
                logging.getLogger(name).setLevel(level)
        try:
            calls = probe(conn, arguments_for, timeout=timeout, on_elicit=on_elicit)
        except MCPError as exc:
            raise CommandError(str(exc)) from None
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
        self.stdout.write(f"{len(calls)} tools at {url}")
        for call in calls:
            self.stdout.write(f"{call.tool.name}({json.dumps(call.arguments, ensure_ascii=False)})")
            if call.error:
                self.stdout.write(f"  protocol error: {one_line(call.error)}")
            elif call.result is not None:
                label = "error result" if call.result.is_error else "result"
                self.stdout.write(f"  {label}: {one_line(call.result.text)}")
        for message, answer in elicited:
            content = json.dumps(answer.content, ensure_ascii=False)
            self.stdout.write(f"elicitation {one_line(message, 80)!r}: {answer.action} {one_line(content)}")

    def probe_auth(self, options) -> ProbeAuth | None:
        """From the conformance scenario if one is set, else from the options."""
        scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
        if scenario:
            try:
                return auth_for_scenario(
                    scenario, os.environ.get("MCP_CONFORMANCE_CONTEXT"), options["client_metadata_url"]
                )
            except ValueError as exc:  # json.JSONDecodeError is one
                raise CommandError(f"MCP_CONFORMANCE_CONTEXT: {exc}") from None
        private_key = ""
        if options["private_key"]:
            try:
                private_key = Path(options["private_key"]).read_text()
            except OSError as exc:
                raise CommandError(f"--private-key: {exc.strerror}: {options['private_key']}") from None
        if options["client_credentials"]:
            if not options["client_id"] or not (options["client_secret"] or private_key):
                raise CommandError(
                    "--client-credentials needs --client-id and --client-secret or --private-key."
                )
            flow = CLIENT_CREDENTIALS
        elif options["oauth"]:
            flow = AUTHORIZATION_CODE
        else:
            if options["client_id"] or options["client_secret"] or private_key or options["scope"]:
                raise CommandError("OAuth options need --oauth or --client-credentials.")
            return None
        return ProbeAuth(
            flow=flow,
            client_id=options["client_id"],
            client_secret=options["client_secret"],
            private_key_pem=private_key,
            scope=options["scope"],
            client_metadata_url=options["client_metadata_url"],
            issuer=options["issuer"],
        )
