"""`manage.py mcp_probe [--header K=V]... URL`: exercise a Streamable HTTP MCP server with the
product's own client (the code the admin action uses).

Lists the tools, calls each with arguments built from its input schema, prints what came back.
Exit 0 when the exchange worked — a tool answering with an error result is still a working
exchange — and non-zero when connecting or speaking MCP failed. The URL is the last argument,
so standard MCP client conformance runners can drive it.
"""

from __future__ import annotations

import json
import logging
from urllib.parse import urlsplit

from django.core.management.base import BaseCommand, CommandError

from tools_app.mcp.client import STREAMABLE_HTTP, Connection, MCPError, probe

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


def one_line(text: str, limit: int = RESULT_CHARS) -> str:
    line = " ".join((text or "").split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class Command(BaseCommand):
    help = (
        "Connect to a Streamable HTTP MCP server with the product's MCP client, list its tools, "
        "call each with arguments built from its schema and print the results."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--header", action="append", default=[], help="K=V sent with every request (repeatable)"
        )
        parser.add_argument("--timeout", type=float, default=30.0, help="seconds per step (default 30)")
        parser.add_argument("url")

    def handle(self, *args, url, header, timeout, **options):
        headers = parse_pairs(header, "--header")
        conn = Connection(
            server_name=urlsplit(url).hostname or url,
            transport=STREAMABLE_HTTP,
            url=url,
            headers=headers,
            timeout=timeout,
            # Header values are credentials as often as not: keep them out of error messages.
            secret_values=tuple(headers.values()),
        )
        # The HTTP client logs every request at INFO; that is noise next to the probe's report.
        http_log = logging.getLogger("httpx2")
        level = http_log.level
        if options["verbosity"] < 2:
            http_log.setLevel(logging.WARNING)
        try:
            calls = probe(conn, arguments_for, timeout=timeout)
        except MCPError as exc:
            raise CommandError(str(exc)) from None
        finally:
            http_log.setLevel(level)
        self.stdout.write(f"{len(calls)} tools at {url}")
        for call in calls:
            self.stdout.write(f"{call.tool.name}({json.dumps(call.arguments, ensure_ascii=False)})")
            if call.error:
                self.stdout.write(f"  protocol error: {one_line(call.error)}")
            elif call.result is not None:
                label = "error result" if call.result.is_error else "result"
                self.stdout.write(f"  {label}: {one_line(call.result.text)}")
