"""Pooled MCP client sessions: one per server configuration per process, reused across calls.

This module owns the process's open MCP sessions: when one is opened, checked, reused, dropped
and closed. `client.call_tool` (and `list_tools(pooled=True)`) run through it; `probe` and the
admin's refresh stay one-shot (`client._run`), since they must prove a fresh connection works.

How it works:
- A `SessionPool` owns one daemon thread running one long-lived asyncio loop. Sync callers
  (Celery tasks, ToolService threads, views) submit a coroutine with `run_coroutine_threadsafe`
  and wait for it; the SDK multiplexes concurrent requests on one session, so parallel
  read-only calls still overlap.
- The key of a session is the tenant, the server and a fingerprint of everything that defines
  the connection (transport, command, args, env, sandbox, URL, headers, guard, timeout,
  `auth_key`): a changed URL, header, secret or authorization opens a new session, and the old
  one closes once its calls end. Sessions are never shared across tenants.
- Each session lives in a runner task of its own (the SDK's task groups must be entered and
  left in one task): it opens the transport, waits until it is told to close, then closes it —
  for stdio that ends the server process.
- Health: a session idle for `XAGENT_MCP_HEALTH_AFTER_SECONDS` is checked with one cheap
  request before reuse; a transport found closed (the stdio process exited, the HTTP server
  went away) drops the session and the call reconnects once. A call whose connection broke
  mid-way is retried once only if it is read-only (a state-changing call may already have run).
  Failed connects back off exponentially (capped at `XAGENT_MCP_RECONNECT_MAX_SECONDS`), so a
  dead server is not hammered and callers get a clear MCPError at once.
- Idle sessions close after `XAGENT_MCP_IDLE_SECONDS`; all close at process exit (atexit, and
  Celery's worker_process_shutdown), so no stdio process is left behind. After `os.fork` the
  child forgets the parent's pool (its thread does not exist there) and builds its own.
- State-changing calls are serialized per session (a lock): a server's `elicitation/create`
  that arrives outside any call's own task (handshake-era stdio servers) is routed to the one
  state-changing call in flight, or the only call in flight; otherwise it is declined.
- `notifications/tools/list_changed` (and 2026-era `subscriptions/listen` events) schedule a
  refresh of that server's tools, debounced, in a thread of its own (it touches the database),
  through `sync.refresh_after_tools_changed` (the owner of Tool rows; `on_tools_changed`
  replaces it).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import concurrent.futures
import contextlib
import contextvars
import hashlib
import json
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError as SDKError
from mcp.types import ElicitResult
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from .client import (
    CONNECTION_CLOSED,
    STDIO,
    STREAMABLE_HTTP,
    Connection,
    ElicitHandler,
    MCPError,
    _describe,
    _elicitation_callback,
    _failure,
    _guard_for,
    _leaf,
    _limit,
    _open_client,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULTS = {
    "XAGENT_MCP_IDLE_SECONDS": 300.0,
    "XAGENT_MCP_HEALTH_AFTER_SECONDS": 30.0,
    "XAGENT_MCP_RECONNECT_MAX_SECONDS": 30.0,
    "XAGENT_MCP_LIST_CHANGED_DEBOUNCE_SECONDS": 1.0,
}
FIRST_BACKOFF_SECONDS = 0.5
CLOSE_WAIT_SECONDS = 10.0  # the SDK gives a stdio server ~2 s to exit before it kills the tree
SYNC_WAIT_SLACK_SECONDS = 5.0

_CURRENT_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("mcp_pool_call", default=None)


def _setting(name: str) -> float:
    try:
        from django.conf import settings

        return float(getattr(settings, name, DEFAULTS[name]))
    except Exception:  # Django not configured (a bare script): the defaults
        return DEFAULTS[name]


def pool_enabled() -> bool:
    try:
        from django.conf import settings

        return bool(getattr(settings, "XAGENT_MCP_POOL", True))
    except Exception:
        return True


def pool_key(conn: Connection) -> tuple:
    """(tenant, server, fingerprint): what a pooled session may be reused for."""
    defining = {
        "transport": conn.transport,
        "command": conn.command,
        "args": list(conn.args),
        "env": conn.env,
        "url": conn.url,
        "headers": conn.headers,
        "guarded": conn.guarded,
        "guard_trusts": conn.guard_trusts,
        "timeout": conn.timeout,
        "auth_key": conn.auth_key,
        "sandbox": conn.sandbox,  # its directory, network, read paths and limits (a dataclass)
        # Without an auth_key, a different auth object must not reuse a session built on another.
        "auth": "" if conn.auth is None or conn.auth_key else f"object:{id(conn.auth)}",
    }
    digest = hashlib.sha256(json.dumps(defining, sort_keys=True, default=str).encode()).hexdigest()
    return (conn.tenant_id, conn.server_id, conn.server_name, digest[:32])


@dataclass(eq=False)
class _Call:
    """One operation in flight on a pooled session."""

    session: PooledSession
    read_only: bool
    on_elicit: ElicitHandler | None
    renew: Callable[..., None] = lambda pause=False: None


@dataclass
class _Backoff:
    failures: int = 0
    next_attempt_at: float = 0.0
    last_error: str = ""
    kind: type = MCPError  # an AuthorizationRequired stays one (the message names who can fix it)


@dataclass(eq=False)
class PooledSession:
    """One open MCP client session and what the pool knows about it (loop thread only)."""

    key: tuple
    conn: Connection
    limit: float
    errlog: IO[str]
    guard: Any = None
    client: Client | None = None
    error: BaseException | None = None
    failure: MCPError | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False
    retiring: bool = False  # superseded by a newer configuration: closes when its calls end
    runner: asyncio.Task | None = None
    opened_at: float = 0.0
    last_used: float = 0.0
    calls: int = 0
    in_flight: dict[int, _Call] = field(default_factory=dict)
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # (POST number, status) of recent POSTs: >= 400 is a failure, None a success. The SDK turns an
    # HTTP error into a generic protocol error; the latest failing POST of a call names it.
    posts: collections.deque = field(default_factory=lambda: collections.deque(maxlen=256))
    post_count: int = 0
    refresh_timer: asyncio.TimerHandle | None = None

    async def record_status(self, response: httpx2.Response) -> None:
        if response.request.method == "POST":
            self.post_count += 1
            self.posts.append(
                (self.post_count, response.status_code if response.status_code >= 400 else None)
            )

    def statuses_since(self, count: int) -> list[int | None]:
        return [status for number, status in self.posts if number > count]

    def transport_closed(self) -> bool:
        """The connection is known dead: the runner ended, or the SDK's dispatcher saw EOF.

        The SDK has no public "closed" signal; its dispatcher's `_closed` flag is what makes
        every later request fail with CONNECTION_CLOSED, so it is read here (False if absent).
        """
        if self.closed or self.client is None:
            return True
        dispatcher = getattr(self.client.session, "_dispatcher", None)
        return bool(getattr(dispatcher, "_closed", False))

    async def healthy(self) -> bool:
        """One cheap request: `ping` on handshake-era connections, `server/discover` on 2026-era ones."""
        if self.transport_closed():
            return False
        session = self.client.session
        try:
            with anyio.fail_after(min(self.limit, 10.0)):
                version = session.protocol_version
                if version in MODERN_PROTOCOL_VERSIONS:
                    await session.send_discover(version)
                else:
                    await session.send_ping()
        except Exception as exc:
            logger.info("MCP server %s failed its health check: %r", self.conn.server_name, _leaf(exc))
            return False
        return True

    async def route_elicitation(self, context, params):
        """The session's one elicitation callback: find the call it belongs to (see module doc)."""
        call = _CURRENT_CALL.get()
        if call is None or call.session is not self:
            in_flight = list(self.in_flight.values())
            writers = [c for c in in_flight if not c.read_only]
            call = writers[0] if len(writers) == 1 else in_flight[0] if len(in_flight) == 1 else None
            if call is None:
                logger.warning(
                    "MCP server %s asked for input with %d calls in flight and no way to tell whose "
                    "it is: declined",
                    self.conn.server_name,
                    len(in_flight),
                )
                return ElicitResult(action="decline")
        if call.on_elicit is None:
            logger.info(
                "MCP server %s asked for input during a call without a handler: declined",
                self.conn.server_name,
            )
            return ElicitResult(action="decline")
        return await _elicitation_callback(call.on_elicit, call.renew)(context, params)

    def describe(self) -> dict:
        now = time.monotonic()
        return {
            "tenant_id": self.key[0],
            "server_id": self.key[1],
            "server_name": self.key[2],
            "fingerprint": self.key[3],
            "transport": self.conn.transport,
            "open": self.client is not None and not self.transport_closed(),
            "calls": self.calls,
            "in_flight": len(self.in_flight),
            "idle_seconds": round(now - self.last_used, 3),
            "protocol_version": self.client.session.protocol_version if self.client else None,
        }


class _NotSent(Exception):
    """The session was found dead before the request left: reconnecting and sending is safe."""


class SessionPool:
    """The process's pooled sessions and the loop thread they live on."""

    def __init__(self) -> None:
        self._sessions: dict[tuple, PooledSession] = {}  # touched on the loop thread only
        self._backoff: dict[tuple, _Backoff] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._reaper: asyncio.Task | None = None
        self.connects = 0  # sessions opened by this pool (inspection, tests, bench)

    # --- the loop thread -------------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name="mcp-pool", daemon=True)
                self._thread.start()
                started.wait()
                self._loop = loop
                asyncio.run_coroutine_threadsafe(self._start_reaper(), loop).result()
            return self._loop

    def _submit(self, coroutine: Awaitable[T], timeout: float | None) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("a pooled MCP operation cannot be waited for on the pool's own thread")
        loop = self._ensure_loop()
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise
        except BaseException:
            future.cancel()  # the waiting thread was interrupted (a soft time limit): stop the call
            raise

    # --- operations ------------------------------------------------------------------------

    def run(
        self,
        conn: Connection,
        doing: str,
        operation: Callable[[Client, Callable[..., None]], Awaitable[T]],
        timeout: float | None = None,
        *,
        on_elicit: ElicitHandler | None = None,
        read_only: bool = False,
    ) -> T:
        """Run `operation(client, renew)` on the pooled session of `conn`; failures are MCPError."""
        if conn.transport not in (STDIO, STREAMABLE_HTTP):
            raise MCPError(f"{conn.label} has an unknown transport {conn.transport!r}.")
        limit = _limit(conn, timeout)
        # Connecting and the operation each have the deadline; a person answering pauses it.
        wait = None if on_elicit else 2 * limit + SYNC_WAIT_SLACK_SECONDS
        try:
            return self._submit(self._run(conn, doing, operation, limit, on_elicit, read_only), wait)
        except concurrent.futures.TimeoutError:
            raise MCPError(_describe(conn, doing, TimeoutError(), limit, "")) from None

    async def _run(self, conn, doing, operation, limit, on_elicit, read_only):
        key = pool_key(conn)
        for attempt in (1, 2):
            session = await self._acquire(key, conn, doing, limit)
            call = _Call(session=session, read_only=read_only, on_elicit=on_elicit)
            refusals_before = len(session.guard.refusals) if session.guard is not None else 0
            posts_before = session.post_count
            started = False
            try:
                with anyio.fail_after(limit) as scope:

                    def renew(pause: bool = False, scope=scope) -> None:
                        scope.deadline = math.inf if pause else anyio.current_time() + limit

                    call.renew = renew
                    lock = contextlib.nullcontext() if read_only else session.write_lock
                    async with lock:
                        if session.transport_closed():
                            raise _NotSent
                        renew()  # waiting for the lock is not the server's time
                        token = _CURRENT_CALL.set(call)
                        session.in_flight[id(call)] = call
                        session.calls += 1
                        started = True
                        try:
                            return await operation(session.client, renew)
                        finally:
                            session.in_flight.pop(id(call), None)
                            session.last_used = time.monotonic()
                            _CURRENT_CALL.reset(token)
                            if session.retiring and not session.in_flight:
                                session.closing.set()
            except _NotSent:
                await self._drop(session, "its transport closed while it was idle")
                if attempt == 1:
                    continue
                raise MCPError(
                    _describe(conn, doing, SDKError(CONNECTION_CLOSED, "Connection closed"), limit, "")
                ) from None
            except Exception as exc:
                refused_auth = conn.auth is not None and 401 in session.statuses_since(posts_before)
                if refused_auth:
                    # The authorization this session was opened with is gone (revoked, expired past
                    # refreshing): the server did not run the call. A new session asks afresh and
                    # says who can fix it (AuthorizationRequired), as a first connection would.
                    await self._drop(session, "its authorization was refused")
                    if attempt == 1:
                        continue
                broken = _broken(exc) or session.transport_closed()
                if broken:
                    await self._drop(session, f"the connection broke: {type(_leaf(exc)).__name__}")
                    if attempt == 1 and (read_only or not started):
                        logger.info("MCP server %s: connection lost, reconnecting once", conn.server_name)
                        continue
                refusals = session.guard.refusals[refusals_before:] if session.guard is not None else []
                raise _failure(
                    conn,
                    doing,
                    exc,
                    limit,
                    refusal=refusals[0] if refusals else None,
                    http_status=(session.statuses_since(posts_before) or [None])[-1],
                    errlog=session.errlog,
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _acquire(self, key: tuple, conn: Connection, doing: str, limit: float) -> PooledSession:
        """The open session for `key`: reused (checked if it idled), or opened now."""
        session = self._sessions.get(key)
        if session is not None and session.client is not None and not session.in_flight:
            idle = time.monotonic() - session.last_used
            if idle > _setting("XAGENT_MCP_HEALTH_AFTER_SECONDS") and not await session.healthy():
                await self._drop(session, "it failed its health check")
                session = None
        if session is not None and session.transport_closed() and session.ready.is_set():
            await self._drop(session, "its transport closed")
            session = None
        if session is None:
            backoff = self._backoff.get(key)
            now = time.monotonic()
            if backoff is not None and now < backoff.next_attempt_at:
                wait = backoff.next_attempt_at - now
                raise backoff.kind(
                    f"{backoff.last_error} (Not retried yet: {backoff.failures} attempt"
                    f"{'s' if backoff.failures != 1 else ''} to connect failed in a row; "
                    f"the next one is allowed in {wait:.1f} s.)"
                )
            self._retire_superseded(key)
            session = self._open(key, conn, limit)
        try:
            with anyio.fail_after(limit):
                await session.ready.wait()
        except TimeoutError:
            raise MCPError(_describe(conn, doing, TimeoutError(), limit, "")) from None
        if session.error is not None:
            raise self._connect_failed(key, conn, doing, limit, session)
        return session

    def _open(self, key: tuple, conn: Connection, limit: float) -> PooledSession:
        errlog = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        session = PooledSession(
            key=key,
            conn=conn,
            limit=limit,
            errlog=errlog,
            guard=_guard_for(conn),
        )
        session.opened_at = session.last_used = time.monotonic()
        self._sessions[key] = session
        # A clean context: the runner must not inherit the opening call's _CURRENT_CALL.
        session.runner = asyncio.get_running_loop().create_task(
            self._serve(session), context=contextvars.Context()
        )
        return session

    async def _serve(self, session: PooledSession) -> None:
        """The runner task of one session: open, stay open until told to close, close."""
        conn = session.conn
        try:
            with anyio.CancelScope() as scope:
                scope.deadline = anyio.current_time() + session.limit
                async with contextlib.AsyncExitStack() as stack:
                    session.client = await _open_client(
                        stack,
                        conn,
                        limit=session.limit,
                        errlog=session.errlog,
                        guard=session.guard,
                        on_response=session.record_status,
                        elicitation_callback=session.route_elicitation,
                        message_handler=lambda message: self._on_message(session, message),
                    )
                    async with anyio.create_task_group() as tasks:
                        # Subscribed before the first call: a change that call causes is heard.
                        await tasks.start(self._listen, session)
                        scope.deadline = math.inf
                        self.connects += 1
                        self._backoff.pop(session.key, None)
                        session.ready.set()
                        await session.closing.wait()
                        tasks.cancel_scope.cancel()
            if scope.cancelled_caught and not session.ready.is_set():
                session.error = TimeoutError()
        except BaseException as exc:  # noqa: BLE001 — every failure is reported to the callers
            if session.ready.is_set():
                logger.info("MCP session of %s ended: %r", conn.server_name, _leaf(exc))
            else:
                session.error = exc
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            session.closed = True
            session.ready.set()
            if self._sessions.get(session.key) is session:
                del self._sessions[session.key]
            if session.refresh_timer is not None:
                session.refresh_timer.cancel()
            if session.error is None:  # a failed opening's stderr is read by _connect_failed
                session.errlog.close()

    def _connect_failed(self, key, conn, doing, limit, session) -> MCPError:
        if session.failure is not None:  # several callers waited for one failed opening
            return session.failure
        exc = session.error
        refusals = session.guard.refusals if session.guard is not None else []
        leaf = _leaf(exc)
        # Our own sentences (a stdio server the sandbox refused to start) pass unchanged.
        error = (
            leaf
            if isinstance(leaf, MCPError)
            else _failure(
                conn,
                doing,
                exc,
                limit,
                refusal=refusals[0] if refusals else None,
                http_status=(session.statuses_since(0) or [None])[-1],
                errlog=session.errlog,
            )
        )
        with contextlib.suppress(Exception):
            session.errlog.close()
        backoff = self._backoff.setdefault(key, _Backoff())
        backoff.failures += 1
        delay = min(
            FIRST_BACKOFF_SECONDS * 2 ** (backoff.failures - 1), _setting("XAGENT_MCP_RECONNECT_MAX_SECONDS")
        )
        backoff.next_attempt_at = time.monotonic() + delay
        backoff.last_error = str(error)
        backoff.kind = type(error)
        session.failure = error
        return error

    async def _listen(self, session: PooledSession, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        """2026-era servers send list-changed events only on a `subscriptions/listen` stream: keep
        one open (its events reach `_on_message` like a handshake-era notification does).

        Its loss is how a dead connection is noticed without a call. A stream that ends while
        the connection lives (an HTTP stream idle past its read timeout, a server restart) is
        opened again, and the tools are refreshed once: events in between were missed (there is
        no replay). A server that refuses the subscription keeps its session, without events."""
        client = session.client
        capabilities = client.server_capabilities
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS or not (
            capabilities.tools and capabilities.tools.list_changed
        ):
            task_status.started()
            return
        subscribed_before = False
        pause = 1.0
        while True:
            try:
                async with client.listen(tools_list_changed=True) as subscription:
                    if subscribed_before:
                        self._tools_changed(session)
                    else:
                        task_status.started()
                        subscribed_before = True
                    opened = time.monotonic()
                    async for _event in subscription:
                        pass  # delivered to _on_message by the SDK's tee
                    if time.monotonic() - opened > 60:
                        pause = 1.0  # a stream that lasted: not a server closing each at once
            except Exception as exc:
                if session.transport_closed():
                    # Noticed without a call: the next one opens a new session at once.
                    await self._drop(session, f"its connection closed ({type(_leaf(exc)).__name__})")
                    return
                if not subscribed_before:
                    task_status.started()  # a refused subscription does not stop the session
                    logger.info(
                        "MCP server %s: no tools/list_changed events (%r)",
                        session.conn.server_name,
                        _leaf(exc),
                    )
                    return
            await anyio.sleep(pause)
            pause = min(pause * 2, _setting("XAGENT_MCP_RECONNECT_MAX_SECONDS"))

    # --- list_changed -----------------------------------------------------------------------

    async def _on_message(self, session: PooledSession, message) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self._tools_changed(session)
        elif isinstance(message, Exception):
            logger.info("MCP server %s: transport error %r", session.conn.server_name, message)

    def _tools_changed(self, session: PooledSession) -> None:
        if session.refresh_timer is not None or _TOOLS_CHANGED_HANDLER is None:
            return  # one refresh per burst of notifications
        delay = _setting("XAGENT_MCP_LIST_CHANGED_DEBOUNCE_SECONDS")
        session.refresh_timer = asyncio.get_running_loop().call_later(delay, self._start_refresh, session)

    def _start_refresh(self, session: PooledSession) -> None:
        session.refresh_timer = None
        handler = _TOOLS_CHANGED_HANDLER
        if handler is None:
            return

        def refresh() -> None:
            try:
                handler(session.conn)
            except Exception:
                logger.exception("Refreshing the tools of MCP server %s failed", session.conn.server_name)

        # A thread: the handler uses the database (Django's sync ORM) and calls back into the pool.
        threading.Thread(target=refresh, name=f"mcp-refresh-{session.conn.server_name}", daemon=True).start()

    # --- closing ----------------------------------------------------------------------------

    async def _drop(self, session: PooledSession, why: str) -> None:
        if self._sessions.get(session.key) is session:
            del self._sessions[session.key]
            logger.info("MCP session of %s dropped: %s", session.conn.server_name, why)
        session.closing.set()

    def _retire_superseded(self, key: tuple) -> None:
        """A server's configuration changed (URL, header, secret, authorization): its sessions
        under the old fingerprint take no new calls and close once their calls end."""
        for old_key, session in list(self._sessions.items()):
            if old_key[:3] == key[:3] and old_key != key:
                del self._sessions[old_key]
                session.retiring = True
                logger.info("MCP session of %s retired: its configuration changed", session.conn.server_name)
                if not session.in_flight:
                    session.closing.set()

    async def _start_reaper(self) -> None:
        self._reaper = asyncio.get_running_loop().create_task(self._reap(), context=contextvars.Context())

    async def _reap(self) -> None:
        """Close sessions idle past XAGENT_MCP_IDLE_SECONDS, and sessions superseded by a newer key."""
        while True:
            idle_limit = _setting("XAGENT_MCP_IDLE_SECONDS")
            await asyncio.sleep(max(0.5, min(idle_limit / 4, 30.0)))
            now = time.monotonic()
            for session in list(self._sessions.values()):
                if not session.in_flight and session.ready.is_set() and now - session.last_used > idle_limit:
                    await self._drop(session, "idle")

    async def _close_all(self, timeout: float) -> int:
        sessions = list(self._sessions.values())
        self._sessions.clear()
        self._backoff.clear()  # a fresh start: the next call tries at once
        for session in sessions:
            session.closing.set()
        runners = [s.runner for s in sessions if s.runner is not None]
        if runners:
            await asyncio.wait(runners, timeout=timeout)
        return len(sessions)

    def close_all(self, timeout: float = CLOSE_WAIT_SECONDS) -> int:
        """Close every pooled session (stdio processes end); returns how many were open."""
        if self._loop is None or not self._loop.is_running():
            return 0
        return self._submit(self._close_all(timeout), timeout + SYNC_WAIT_SLACK_SECONDS)

    def sessions(self) -> list[dict]:
        """What is pooled now (the inspection API: tests, the bench, debugging)."""
        if self._loop is None:
            return []

        async def snapshot() -> list[dict]:
            return [s.describe() for s in self._sessions.values()]

        return self._submit(snapshot(), CLOSE_WAIT_SECONDS)


def _broken(exc: BaseException) -> bool:
    """Whether a failure says the connection itself is gone (not a timeout, not a tool error)."""
    leaf = _leaf(exc)
    if isinstance(leaf, SDKError):
        return leaf.code == CONNECTION_CLOSED
    if isinstance(leaf, TimeoutError | httpx2.TimeoutException):
        return False
    return isinstance(
        leaf, httpx2.TransportError | anyio.ClosedResourceError | anyio.BrokenResourceError | OSError
    )


# --- the process's pool ---------------------------------------------------------------------

_POOL: SessionPool | None = None
_POOL_LOCK = threading.Lock()


def _refresh_tool_rows(conn: Connection) -> None:
    # Imported when a server's tools change, not at import: sync is loaded at every process
    # start (the admin imports it), this module and the MCP SDK only when MCP is used.
    from .sync import refresh_after_tools_changed

    refresh_after_tools_changed(conn)


_TOOLS_CHANGED_HANDLER: Callable[[Connection], None] | None = _refresh_tool_rows


def get_pool() -> SessionPool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = SessionPool()
        return _POOL


def close_pool() -> int:
    """Close this process's pooled sessions (process exit, tests); the pool stays usable."""
    pool = _POOL
    return pool.close_all() if pool is not None else 0


def on_tools_changed(handler: Callable[[Connection], None] | None) -> None:
    """Replace what runs (in a thread) when a pooled server says its tools changed (None: nothing)."""
    global _TOOLS_CHANGED_HANDLER
    _TOOLS_CHANGED_HANDLER = handler


def _forget_in_child() -> None:
    # The parent's loop thread does not exist in a forked child: start over there. (Its
    # sessions' pipes were inherited; closing them is the parent's business.)
    global _POOL, _POOL_LOCK
    _POOL = None
    _POOL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(close_pool)
