"""The product's one MCP client: a synchronous facade over the official SDK's async API.

Every operation is synchronous, so it can be called from Django views, admin actions,
management commands and Celery/ToolService threads alike. `call_tool` runs on the process's
pooled session of the server (`pool.py`: one per server configuration, reused, health-checked);
`probe` and `list_tools` (the admin's refresh) open their own connection in a fresh event loop
(`asyncio.run`) unless asked to pool, since they must prove that a new connection works.

Every failure — refused connection, a process that exits, a timeout, a protocol error — comes
out as one `MCPError` whose message is a human sentence naming the server and what failed.
Messages never carry tracebacks, and any secret value injected into the connection is masked.

Trust boundary (ARCHITECTURE §7): a stdio server is started only if an operator configured it,
and only inside the process sandbox (`tools_app.mcp.stdio`, `tools_app.sandbox.server`); a
tenant-set HTTP server is reached only through the outbound guard (`tools_app.net`); for such a
`guarded` connection, messages never repeat what the target answered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import math
import os
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.to_thread
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT
from mcp.shared.exceptions import MCPError as SDKError
from mcp.types import ElicitResult, ErrorData, Implementation
from pydantic import ValidationError

from tools_app.base import ToolError
from tools_app.net import async_guarded_transport, exception_in, origin_of, refusal_in
from tools_app.sandbox.identity import SandboxIdentity
from tools_app.sandbox.server import CommandNotFound, ServerSandbox, prepare_server
from tools_app.secrets import MissingSecret, Redactor, resolve_refs

STDIO = "stdio"
STREAMABLE_HTTP = "streamable_http"
HINT_KEYS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
CONNECTION_CLOSED = -32000  # the SDK's code for "the other side went away"
MAX_PAGES = 100  # a server whose tools/list never ends must not hang a refresh
STDERR_TAIL_CHARS = 300
CLIENT_INFO = Implementation(name="xagent-workspace", version="0.1.0")

T = TypeVar("T")


class MCPError(Exception):
    """An MCP operation failed; `str(error)` is a sentence fit for an admin or a model."""


class AuthorizationRequired(MCPError):
    """The server needs a person's authorization (OAuth consent) that this call cannot get;
    the message names who can give it. Raised before connecting, or by the OAuth provider's
    redirect handler mid-connection, which ends the call at once."""


@dataclass(frozen=True)
class Connection:
    """How to reach one MCP server, with `{{secret:...}}` references already resolved.

    `env` and `headers` carry secret values, so they stay out of `repr`; `secret_values` are
    the tenant's secrets, masked in every error message this client produces.
    """

    server_name: str
    transport: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False)
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    timeout: float = 30.0
    secret_values: tuple[str, ...] = field(default=(), repr=False)
    # A tenant-set HTTP endpoint: connect through the outbound guard, never echo its answers.
    guarded: bool = False
    # An operator's OAuth server ("host:port" of its URL): that origin is trusted, but the
    # endpoints its metadata names (authorization server, token, registration) are guarded.
    guard_trusts: str = ""
    # HTTP only: an `httpx2.Auth` (the SDK's OAuthClientProvider) that authorizes every request.
    auth: Any = field(default=None, repr=False, compare=False)
    # Changes whenever the authorization behind `auth` does (connected, refreshed by an admin,
    # revoked), so anything keyed by a Connection (a pooled session) can tell it apart.
    auth_key: str = ""
    # stdio only: the sandbox the server runs in (`sandbox.server`); a stdio Connection without
    # one is never started.
    sandbox: ServerSandbox | None = None
    # Who the connection is for: a pooled session is never shared across tenants or servers.
    tenant_id: int | None = None
    server_id: int | None = None

    @property
    def label(self) -> str:
        return f"MCP server {self.server_name!r}"


@dataclass(frozen=True)
class ElicitAnswer:
    """A person's (or a default's) answer to a server's `elicitation/create`."""

    action: str  # "accept", "decline" or "cancel"
    content: dict | None = None


# (message, requested_schema) -> answer. Synchronous and allowed to block (a person answering):
# the client runs it in a worker thread, so the connection keeps serving meanwhile.
ElicitHandler = Callable[[str, dict], ElicitAnswer]


@dataclass
class RemoteTool:
    name: str
    description: str
    input_schema: dict
    annotations: dict = field(default_factory=dict)


@dataclass
class RemoteResult:
    text: str
    structured: Any = None
    is_error: bool = False


@dataclass
class ProbeCall:
    tool: RemoteTool
    arguments: dict
    result: RemoteResult | None = None
    error: str = ""  # the server answered this call with a JSON-RPC error


def connection_for(server, secrets: dict[str, str]) -> Connection:
    """Build the Connection for an `MCPServer` row, resolving secret references.

    Raises MCPError if a referenced secret is not set for the server's tenant, or if the
    server is a stdio one no operator configured (its command is never started).
    """
    conn = _connection_for(server, secrets)
    return dataclasses.replace(conn, tenant_id=server.tenant_id, server_id=server.pk)


def _connection_for(server, secrets: dict[str, str]) -> Connection:
    if server.transport == STDIO and not server.configured_by_operator:
        raise MCPError(
            f"MCP server {server.name!r} was not started: a stdio server runs a command on the host, "
            "and only an operator (a superuser, or manage.py mcp_server add) may configure one."
        )
    try:
        env = {str(k): str(v) for k, v in resolve_refs(dict(server.env or {}), secrets).items()}
        headers = {str(k): str(v) for k, v in resolve_refs(dict(server.headers or {}), secrets).items()}
    except MissingSecret as exc:
        raise MCPError(
            f"MCP server {server.name!r} refers to the secret {exc.args[0]!r}, which is not set for this tenant."
        ) from None
    timeout = float(server.timeout_seconds or 30)
    if server.transport == STDIO:
        from .stdio import sandbox_for

        try:
            sandbox = sandbox_for(server)
        except ValueError as exc:
            raise MCPError(f"MCP server {server.name!r} was not started: {exc}") from None
        return Connection(
            server_name=server.name,
            transport=STDIO,
            command=server.command,
            args=tuple(str(a) for a in (server.args or [])),
            # Exactly these reach the server (the sandbox sets PATH, HOME, LANG and TMPDIR unless given).
            env=env,
            timeout=timeout,
            secret_values=tuple(secrets.values()),
            sandbox=sandbox,
        )
    if server.transport == STREAMABLE_HTTP:
        from .oauth import oauth_for  # models live there; this module stays usable without them

        auth, auth_key = oauth_for(server)
        return Connection(
            server_name=server.name,
            transport=STREAMABLE_HTTP,
            url=server.url,
            headers=headers,
            timeout=timeout,
            secret_values=tuple(secrets.values()) + tuple(getattr(auth, "redact_values", ())),
            guarded=not server.configured_by_operator,
            guard_trusts=origin_of(server.url) if auth is not None and server.configured_by_operator else "",
            auth=auth,
            auth_key=auth_key,
        )
    raise MCPError(f"MCP server {server.name!r} has an unknown transport {server.transport!r}.")


# --- the three operations -----------------------------------------------------------------


def list_tools(conn: Connection, timeout: float | None = None, *, pooled: bool = False) -> list[RemoteTool]:
    """List every tool (following pagination).

    One-shot by default (connect, list, disconnect): an admin's refresh proves that a new
    connection with the current configuration works. `pooled=True` lists on the pooled session
    instead — what a `tools/list_changed` refresh does, since that session is the one whose
    server changed (a stdio server's tools may exist only in that process)."""

    async def operation(client: Client, renew: Callable[[], None]) -> list[RemoteTool]:
        return await _list_all(client, renew)

    if pooled:
        return _pool().run(conn, "listing its tools", operation, timeout, read_only=True)
    return _run(conn, "listing its tools", operation, timeout)


def call_tool(
    conn: Connection,
    name: str,
    arguments: dict,
    timeout: float | None = None,
    on_elicit: ElicitHandler | None = None,
    *,
    read_only: bool = False,
    pooled: bool | None = None,
) -> RemoteResult:
    """Call one tool. A tool-level failure is `RemoteResult(is_error=True)`.

    Runs on the pooled session of the server (`pooled=None` follows XAGENT_MCP_POOL, on by
    default). `read_only` calls may overlap on that session and are retried once on a fresh
    connection if it broke mid-call; others are serialized per session and never resent.
    `on_elicit` answers the server's elicitation requests during the call; without it they are
    declined as unsupported."""

    async def operation(client: Client, renew: Callable[[], None]) -> RemoteResult:
        # With an elicitation handler the call may wait on a person: the deadline of `_run`
        # (paused while they answer) bounds it, not the SDK's read timeout.
        read_timeout = math.inf if on_elicit else _limit(conn, timeout)
        return _to_result(await client.call_tool(name, arguments, read_timeout_seconds=read_timeout))

    doing = f"calling the tool {name!r}"
    from .pool import pool_enabled

    if pool_enabled() if pooled is None else pooled:
        return _pool().run(conn, doing, operation, timeout, on_elicit=on_elicit, read_only=read_only)
    return _run(conn, doing, operation, timeout, on_elicit)


def _pool():
    from .pool import get_pool  # pool.py builds on this module

    return get_pool()


def probe(
    conn: Connection,
    arguments_for: Callable[[dict], dict],
    timeout: float | None = None,
    on_elicit: ElicitHandler | None = None,
) -> list[ProbeCall]:
    """One session: list the tools, then call each with `arguments_for(input_schema)`.

    A call the server answers with a JSON-RPC error is recorded on its ProbeCall (the exchange
    worked); a broken connection or a timeout raises MCPError.
    """

    async def operation(client: Client, renew: Callable[[], None]) -> list[ProbeCall]:
        calls = []
        for tool in await _list_all(client, renew):
            call = ProbeCall(tool=tool, arguments=arguments_for(tool.input_schema))
            renew()
            try:
                raw = await client.call_tool(
                    tool.name,
                    call.arguments,
                    read_timeout_seconds=math.inf if on_elicit else _limit(conn, timeout),
                )
                call.result = _to_result(raw)
            except SDKError as exc:
                if exc.code == CONNECTION_CLOSED:
                    raise
                call.error = f"{exc.message} (code {exc.code})"
            calls.append(call)
        return calls

    return _run(conn, "probing its tools", operation, timeout, on_elicit)


# --- plumbing -------------------------------------------------------------------------------


async def _list_all(client: Client, renew: Callable[[], None]) -> list[RemoteTool]:
    tools: list[RemoteTool] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        renew()
        page = await client.list_tools(cursor=cursor)
        tools.extend(_to_remote_tool(t) for t in page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


def _to_remote_tool(tool) -> RemoteTool:
    hints = {}
    if tool.annotations is not None:
        declared = tool.annotations.model_dump(by_alias=True, exclude_none=True)
        hints = {key: bool(declared[key]) for key in HINT_KEYS if key in declared}
    return RemoteTool(
        name=tool.name,
        description=tool.description or (tool.annotations.title if tool.annotations else None) or "",
        input_schema=dict(tool.input_schema or {"type": "object", "properties": {}}),
        annotations=hints,
    )


def _to_result(result) -> RemoteResult:
    parts = []
    for item in result.content:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind == "resource" and hasattr(item.resource, "text"):
            parts.append(item.resource.text)
        elif kind == "resource_link":
            parts.append(f"[resource: {item.uri}]")
        else:
            parts.append(f"[{kind or 'unknown'} content: {getattr(item, 'mime_type', '') or 'binary'}]")
    structured = result.structured_content
    text = "\n".join(parts)
    if not text and structured is not None:
        text = json.dumps(structured, ensure_ascii=False)
    return RemoteResult(text=text, structured=structured, is_error=bool(result.is_error))


def _limit(conn: Connection, timeout: float | None) -> float:
    return float(timeout if timeout is not None else conn.timeout)


async def _open_client(
    stack: contextlib.AsyncExitStack,
    conn: Connection,
    *,
    limit: float,
    errlog: IO[str],
    guard=None,
    on_response: Callable[[httpx2.Response], Awaitable[None]] | None = None,
    elicitation_callback=None,
    message_handler=None,
) -> Client:
    """Create the transport (a stdio process or an HTTP client) and an entered Client on `stack`.

    The one place a connection is made, pooled or not; closing `stack` ends it."""
    if conn.transport == STDIO:
        # The preflight runs a short sandboxed process: not on the event loop.
        params, identity = await anyio.to_thread.run_sync(_sandboxed_stdio, conn)
        # Entered before the transport, so it runs after the transport has stopped the server:
        # the server's uid goes back to the pool only once nothing of it runs.
        stack.callback(identity.release, sweep=True)
        transport = stdio_client(params, errlog=errlog)
    else:
        # The SDK leaves an HTTP client it was handed open: the stack closes it.
        http = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=conn.headers,
                # Reads may idle longer (a pooled session's listen stream waits for events); the
                # caller's own deadline bounds every operation.
                timeout=httpx2.Timeout(limit, read=max(limit, MCP_DEFAULT_SSE_READ_TIMEOUT)),
                event_hooks={"response": [on_response] if on_response else []},
                transport=guard,
                auth=conn.auth,
            )
        )
        transport = streamable_http_client(conn.url, http_client=http)
    return await stack.enter_async_context(
        Client(
            transport,
            read_timeout_seconds=limit,
            client_info=CLIENT_INFO,
            elicitation_callback=elicitation_callback,
            message_handler=message_handler,
            # Listings must come from the server (a refresh is asked for because they changed).
            cache=None,
        )
    )


def _run(
    conn: Connection,
    doing: str,
    operation: Callable[[Client, Callable[[], None]], Awaitable[T]],
    timeout: float | None,
    on_elicit: ElicitHandler | None = None,
) -> T:
    """One-shot: run `operation(client, renew)` in a session of its own; `renew()` restarts the
    deadline for a next step."""
    limit = _limit(conn, timeout)
    # The SDK turns an HTTP error status into a generic protocol error; keep the status for the message.
    # Only the latest POST's counts: an earlier error may have been answered already (the SDK's own
    # `server/discover` probe draws a 400 from older servers and falls back to `initialize`).
    failed_status: list[int | None] = [None]

    async def record_status(response: httpx2.Response) -> None:
        if response.request.method == "POST":
            failed_status[0] = response.status_code if response.status_code >= 400 else None

    guard = _guard_for(conn)

    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as errlog:

        async def session() -> T:
            with anyio.fail_after(limit) as scope:

                def renew(pause: bool = False) -> None:
                    # pause=True: no deadline while a person answers an elicitation.
                    scope.deadline = math.inf if pause else anyio.current_time() + limit

                async with contextlib.AsyncExitStack() as stack:
                    client = await _open_client(
                        stack,
                        conn,
                        limit=limit,
                        errlog=errlog,
                        guard=guard,
                        on_response=record_status,
                        elicitation_callback=_elicitation_callback(on_elicit, renew) if on_elicit else None,
                    )
                    renew()
                    return await operation(client, renew)

        if conn.transport not in (STDIO, STREAMABLE_HTTP):
            raise MCPError(f"{conn.label} has an unknown transport {conn.transport!r}.")
        try:
            return _run_coroutine(session)
        except MCPError:
            raise
        except Exception as exc:  # every failure becomes one sentence
            refused = guard.refusals[0] if guard is not None and guard.refusals else None
            raise _failure(
                conn, doing, exc, limit, refusal=refused, http_status=failed_status[0], errlog=errlog
            ) from None


def _failure(
    conn: Connection,
    doing: str,
    exc: BaseException,
    limit: float,
    *,
    refusal=None,
    http_status: int | None = None,
    errlog: IO[str] | None = None,
) -> MCPError:
    """The MCPError for a failed operation: one sentence, secrets masked."""
    redactor = Redactor(conn.secret_values)
    needed = exception_in(exc, AuthorizationRequired)
    if needed is not None:
        return AuthorizationRequired(redactor.redact(str(needed)))
    refused = refusal if refusal is not None else refusal_in(exc)
    if refused is not None:
        where = f"{conn.label} at {_public_url(conn.url)}"
        return MCPError(redactor.redact(f"{where} was not contacted: {refused}"))
    stderr = _stderr_tail(errlog) if errlog is not None else ""
    return MCPError(redactor.redact(_describe(conn, doing, _leaf(exc), limit, stderr, http_status)))


def _sandboxed_stdio(conn: Connection) -> tuple[StdioServerParameters, SandboxIdentity]:
    """The SDK's spawn parameters for a stdio server (the sandbox chain, never the bare command)
    and the uid it will run as, which the caller releases when the connection ends."""
    if conn.sandbox is None:
        raise MCPError(f"{conn.label} was not started: a stdio server runs only inside the process sandbox.")
    try:
        launch = prepare_server(conn.command, conn.args, conn.env, conn.sandbox)
    except CommandNotFound:
        raise MCPError(
            f"Could not start {conn.label}: the command {conn.command!r} was not found in its sandbox "
            "(it sees the host's /usr and the server's read-only paths only)."
        ) from None
    except ToolError as exc:
        message = f"Could not start {conn.label}: {str(exc).rstrip('.')}."
        raise MCPError(Redactor(conn.secret_values).redact(message)) from None
    # The SDK adds a few variables of this process (HOME, PATH, ...) to `env`; the launcher
    # execs the chain with exactly the environment it was given, so none reach the server.
    params = StdioServerParameters(
        command=launch.command, args=list(launch.args), env=launch.env, cwd=launch.cwd
    )
    return params, launch.identity


def _guard_for(conn: Connection):
    """The outbound guard of an HTTP connection: everything of a tenant-set server; of an
    operator's OAuth server, whatever is not its own origin; nothing of other operator servers."""
    if conn.guarded:
        return async_guarded_transport()
    if conn.guard_trusts:
        return async_guarded_transport(trusted=conn.guard_trusts)
    return None


def _elicitation_callback(on_elicit: ElicitHandler, renew: Callable[..., None]):
    """The SDK callback for `elicitation/create`: form requests go to `on_elicit` (in a thread,
    since a person may take minutes); URL-mode requests are declined (we never open links)."""

    async def callback(context, params) -> ElicitResult | ErrorData:
        if getattr(params, "mode", "form") != "form":
            return ElicitResult(action="decline")
        schema = params.requested_schema
        schema = (
            schema.model_dump(by_alias=True, exclude_none=True)
            if hasattr(schema, "model_dump")
            else dict(schema)
        )
        renew(pause=True)  # the wait for a person does not count against the call's own deadline
        try:
            answer = await anyio.to_thread.run_sync(on_elicit, params.message, schema, abandon_on_cancel=True)
        finally:
            renew()
        if answer.action == "accept":
            return ElicitResult(action="accept", content=dict(answer.content or {}))
        return ElicitResult(action=answer.action if answer.action in ("decline", "cancel") else "decline")

    return callback


def _run_coroutine(factory: Callable[[], Awaitable[T]]) -> T:
    """`asyncio.run` here, or in a helper thread when this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mcp") as pool:
        return pool.submit(lambda: asyncio.run(factory())).result()


def _leaf(exc: BaseException) -> BaseException:
    """The first meaningful exception inside the task-group wrappers anyio puts around it."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (inner or list(exc.exceptions))[0]
    return exc


def _stderr_tail(errlog: IO[str]) -> str:
    try:
        errlog.flush()
        # A pooled session's log grows for as long as it lives: only its end matters.
        errlog.seek(max(0, errlog.seek(0, os.SEEK_END) - 8 * STDERR_TAIL_CHARS))
        text = errlog.read()
    except (OSError, ValueError):
        return ""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    tail = lines[-1]
    return tail if len(tail) <= STDERR_TAIL_CHARS else tail[: STDERR_TAIL_CHARS - 1] + "…"


def _public_url(url: str) -> str:
    """The URL without user:password, for messages."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        parts = parts._replace(netloc=host)
    return urlunsplit(parts)


HTTP_HINTS = {
    401: " (not authorized: check the server's headers and the secrets they reference)",
    403: " (forbidden: check the server's headers and the secrets they reference)",
    404: " (no MCP endpoint at this URL)",
}


def _describe(
    conn: Connection,
    doing: str,
    exc: BaseException,
    limit: float,
    stderr: str,
    http_status: int | None = None,
) -> str:
    where = f"{conn.label} at {_public_url(conn.url)}" if conn.transport == STREAMABLE_HTTP else conn.label
    said = f" Its last error output: {stderr}" if stderr else ""
    answered = http_status is not None or isinstance(exc, SDKError | httpx2.HTTPStatusError | ValidationError)
    if conn.guarded and answered:
        # A tenant-set endpoint: what it answered is not repeated (no oracle into other hosts).
        return (
            f"{where} did not complete the MCP exchange while {doing} "
            "(the answers of tenant-configured endpoints are not shown)."
        )
    if http_status is not None and isinstance(exc, SDKError | httpx2.HTTPError):
        return f"{where} answered HTTP {http_status}{HTTP_HINTS.get(http_status, '')} while {doing}."
    if isinstance(exc, TimeoutError | httpx2.TimeoutException):
        unit = "second" if limit == 1 else "seconds"
        return f"{where} did not answer within {limit:g} {unit} while {doing}.{said}"
    if isinstance(exc, httpx2.ConnectError):
        return f"Could not connect to {where} while {doing}: the connection was refused or the host is unreachable."
    if isinstance(exc, httpx2.HTTPStatusError):
        return f"{where} answered HTTP {exc.response.status_code} while {doing}."
    if isinstance(exc, httpx2.HTTPError):
        return f"The HTTP exchange with {where} failed while {doing}: {type(exc).__name__}."
    if isinstance(exc, FileNotFoundError):
        return f"Could not start {conn.label}: the command {conn.command!r} was not found."
    if isinstance(exc, PermissionError):
        return f"Could not start {conn.label}: the command {conn.command!r} is not executable."
    if isinstance(exc, SDKError):
        if exc.code == CONNECTION_CLOSED:
            if conn.transport == STDIO:
                return f"{conn.label} closed the connection while {doing} (the process exited).{said}"
            return f"{where} closed the connection while {doing}."
        return f"{where} answered with a protocol error while {doing}: {exc.message} (code {exc.code})."
    if isinstance(exc, ValidationError):
        return f"{where} sent an answer that is not valid MCP while {doing}."
    if isinstance(exc, OSError):
        return f"Could not reach {where} while {doing}: {exc.strerror or type(exc).__name__}.{said}"
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{where} failed while {doing}: {type(exc).__name__}{': ' + detail if detail else ''}.{said}"
