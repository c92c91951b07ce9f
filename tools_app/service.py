"""ToolService: the governance chain for one tool call (ARCHITECTURE §1, §2).

Owns how a call the model proposed becomes a result the model reads, through ordered stages:
resolve -> enabled/readiness -> parse_arguments -> validate -> inject_secrets (a secret reference
the model wrote is refused) -> precheck -> approval -> workspace_lease -> runtime -> normalize.
A stage that refuses names itself in the outcome (`stage`) and in the text the model sees.
Nothing a tool does escapes as an exception except `ApprovalRequired`, which the runtime turns
into a suspended turn. It does not own the loop, the commit of results, or the approval records.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from celery.exceptions import SoftTimeLimitExceeded
from jsonschema import Draft202012Validator

from approvals_app.choices import PolicyAction

from .base import Tool, ToolContext, ToolError, ToolResult
from .registry import NATIVE_TOOLS

logger = logging.getLogger(__name__)

MAX_RESULT_CHARS = 20_000
MAX_SUMMARY_CHARS = 200
MAX_SCHEMA_ERRORS = 5
DEFAULT_LEASE_TIMEOUT = 600.0

# Returns an action, or an object with `.action` and `.reason` (approvals_app.policy.Verdict):
# a deny's reason is shown to the model and on the tool card.
ApprovalHook = Callable[[Tool, dict, ToolContext], Any]


class ApprovalRequired(Exception):
    """Raised by `execute` when policy says a human must decide before this call runs.

    The parsed, validated arguments are on `.arguments` (`Exception.args` is taken), and the
    policy's whole verdict on `.verdict`, so the caller parks the call without evaluating again.
    """

    def __init__(self, tool: Tool, args: dict, call_id: str = "", verdict=None):
        super().__init__(f"tool {tool.name!r} requires approval")
        self.tool = tool
        self.arguments = args
        self.call_id = call_id
        self.verdict = verdict


class ToolCall(NamedTuple):
    call_id: str
    name: str
    arguments: str


@dataclass
class ToolOutcome:
    call_id: str
    name: str
    arguments: dict | None
    ok: bool
    content: str  # what the model sees
    summary: str  # one line for the UI card
    error_code: str | None = None
    stage: str | None = None  # the stage that refused; None on success
    duration_ms: int = 0
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Prepared:
    call_id: str
    tool: Tool
    args: dict  # as the model sent them: what the tool runs with and what evidence shows
    started: float


def refusal_content(stage: str, code: str, message: str) -> str:
    """What the model reads for a call refused or failed before or while running."""
    return f"error in {stage} ({code}): {message}"


# The start of a call's result when an approval rule denies it: a decision, not a tool failure.
DENIED_BY_POLICY = refusal_content("approval", "denied", "")


class _Refused(Exception):
    def __init__(self, stage: str, code: str, message: str):
        super().__init__(message)
        self.stage, self.code, self.message = stage, code, message


# One writer per workspace per process. Keyed by the real path, so two spellings of one
# directory share a lock; weak values, so a long-lived worker does not keep a lock for every
# workspace it ever touched (a lock lives while some call holds a reference to it).
_leases: weakref.WeakValueDictionary[str, threading.Lock] = weakref.WeakValueDictionary()
_leases_guard = threading.Lock()


def _lease_for(workspace: Path) -> threading.Lock:
    key = str(Path(workspace).resolve())
    with _leases_guard:
        return _leases.setdefault(key, threading.Lock())


def _allow_all(tool: Tool, args: dict, ctx: ToolContext) -> str:
    return PolicyAction.ALLOW


def _holds_nul(value) -> bool:
    """Whether a NUL character is in any key or string of parsed JSON (walked without recursion)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n…[truncated: {len(text) - limit} more characters]"


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_SUMMARY_CHARS else line[: MAX_SUMMARY_CHARS - 1] + "…"


def _schema_message(error) -> str:
    """jsonschema's message quotes the whole offending value; a huge one would push the reason
    ("is too long") past the result's size cap, so the model would never learn why."""
    message = error.message
    if len(message) <= 300:
        return message
    quoted = repr(error.instance)
    if len(quoted) > 120 and quoted in message:
        size = (
            f"{len(error.instance)} characters"
            if isinstance(error.instance, str)
            else f"{len(quoted)} characters as JSON"
        )
        message = message.replace(quoted, f"{quoted[:60]}…({size})")
    return message if len(message) <= 600 else message[:600] + "…"


def _json_path(path: Iterable) -> str:
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


class ToolService:
    def __init__(
        self,
        approval_hook: ApprovalHook | None = None,
        *,
        known_tools: dict[str, Tool] | None = None,
        lease_timeout: float = DEFAULT_LEASE_TIMEOUT,
    ):
        self.approval_hook: ApprovalHook = approval_hook or _allow_all
        self.known_tools = NATIVE_TOOLS if known_tools is None else known_tools
        self.lease_timeout = lease_timeout

    # --- one call -----------------------------------------------------------------------

    def execute(
        self,
        call_id: str,
        name: str,
        raw_arguments: str,
        ctx: ToolContext,
        available: dict[str, Tool],
        *,
        approved: bool = False,
    ) -> ToolOutcome:
        """Run one call through every stage. `approved=True` is for re-running a call a human
        approved: a `require_approval` verdict then lets it through (a `deny` still refuses)."""
        prepared = self._prepare(call_id, name, raw_arguments, ctx, available, approved=approved)
        if isinstance(prepared, ToolOutcome):
            return prepared
        return self._run(prepared, ctx)

    # --- a batch from one model response ------------------------------------------------

    def execute_batch(
        self,
        calls: Iterable[ToolCall | tuple[str, str, str]],
        ctx: ToolContext,
        available: dict[str, Tool],
        max_parallel: int = 4,
    ) -> Iterator[ToolOutcome]:
        """Yield one outcome per call, in model order.

        Consecutive read-only calls run concurrently (up to `max_parallel`); any other call is
        a barrier: everything before it has finished before it starts, and it finishes before
        anything after it starts. If a call requires approval, the outcomes before it are
        yielded, then `ApprovalRequired` is raised and no later call runs. Stopping iteration
        early (an interrupt) runs nothing further.
        """
        group: list[_Prepared | ToolOutcome] = []
        for call_id, name, raw in calls:
            try:
                prepared = self._prepare(call_id, name, raw, ctx, available)
            except ApprovalRequired:
                yield from self._flush(group, ctx, max_parallel)
                raise
            if isinstance(prepared, ToolOutcome) or prepared.tool.read_only:
                group.append(prepared)
                continue
            yield from self._flush(group, ctx, max_parallel)
            group = []
            yield self._run(prepared, ctx)
        yield from self._flush(group, ctx, max_parallel)

    def _flush(
        self, group: list[_Prepared | ToolOutcome], ctx: ToolContext, max_parallel: int
    ) -> Iterator[ToolOutcome]:
        runnable = [item for item in group if isinstance(item, _Prepared)]
        if len(runnable) <= 1 or max_parallel <= 1:
            for item in group:
                yield item if isinstance(item, ToolOutcome) else self._run(item, ctx)
            return
        pool = ThreadPoolExecutor(max_workers=min(max_parallel, len(runnable)), thread_name_prefix="tool")
        try:
            futures = {id(item): pool.submit(self._run_in_thread, item, ctx) for item in runnable}
            for item in group:
                yield item if isinstance(item, ToolOutcome) else futures[id(item)].result()
        finally:
            # If the caller stops iterating (an interrupt), calls not yet started never start.
            pool.shutdown(wait=True, cancel_futures=True)

    # --- stages -------------------------------------------------------------------------

    def _prepare(
        self,
        call_id: str,
        name: str,
        raw_arguments: str | dict | None,
        ctx: ToolContext,
        available: dict[str, Tool],
        *,
        approved: bool = False,
    ) -> _Prepared | ToolOutcome:
        started = time.monotonic()
        args: dict | None = None
        try:
            tool = self._resolve(name, available)
            self._check_enabled(tool)
            args = self._parse_arguments(raw_arguments)
            self._validate(tool, args)
            self._refuse_secrets(args)
            self._precheck(tool, args, ctx)
            self._approval(tool, args, ctx, call_id, approved)
        except _Refused as refusal:
            return self._error(call_id, name, args, refusal.stage, refusal.code, refusal.message, started)
        return _Prepared(call_id=call_id, tool=tool, args=args, started=started)

    @staticmethod
    def _precheck(tool: Tool, args: dict, ctx: ToolContext) -> None:
        """precheck: the tool's own refusals that need no execution (e.g. a read-only path)."""
        try:
            tool.precheck(ctx, args)
        except ToolError as exc:
            raise _Refused("precheck", exc.code, str(exc)) from exc

    @staticmethod
    def _check_enabled(tool: Tool) -> None:
        """enabled/readiness: an admin switched it off, or its source (an MCP server) is not ready."""
        if getattr(tool, "enabled", True) is False:
            raise _Refused("enabled", "tool_disabled", f"tool {tool.name!r} is disabled by an administrator")
        reason = getattr(tool, "unavailable_reason", "")
        if reason:
            raise _Refused("readiness", "tool_not_ready", f"tool {tool.name!r} is not ready: {reason}")

    @staticmethod
    def _refuse_secrets(args: dict) -> None:
        """inject_secrets: a `{{secret:NAME}}` the model wrote is refused, never resolved. Secrets
        reach a tool only through configuration an admin wrote (ARCHITECTURE §7): a tool set's
        shell environment (`ctx.env`), an MCP server's headers and env. Before approval, so
        nobody is asked to approve a call that cannot run."""
        from .secrets import SecretNotAllowed, refuse_secret_references

        try:
            refuse_secret_references(args)
        except SecretNotAllowed as exc:
            raise _Refused("inject_secrets", "secret_not_allowed", str(exc)) from None

    def _resolve(self, name: str, available: dict[str, Tool]) -> Tool:
        tool = available.get(name)
        if tool is not None:
            return tool
        offered = ", ".join(sorted(available)) or "none"
        if name in self.known_tools:
            raise _Refused(
                "resolve",
                "tool_unavailable",
                f"tool {name!r} is not available in this session (available tools: {offered})",
            )
        raise _Refused("resolve", "unknown_tool", f"unknown tool {name!r} (available tools: {offered})")

    def _parse_arguments(self, raw: str | dict | None) -> dict:
        if isinstance(raw, dict):
            return raw
        if raw is None or not str(raw).strip():
            return {}  # models send "" for tools without parameters
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _Refused(
                "parse_arguments",
                "invalid_json",
                f"arguments are not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})",
            ) from exc
        except RecursionError:
            raise _Refused("parse_arguments", "invalid_json", "arguments are nested too deeply") from None
        if not isinstance(value, dict):
            raise _Refused(
                "parse_arguments",
                "invalid_arguments",
                f"arguments must be a JSON object, got {type(value).__name__ if value is not None else 'null'}",
            )
        if _holds_nul(value):
            # No tool takes NUL (paths, commands, PostgreSQL text all refuse it): say so, early.
            raise _Refused(
                "parse_arguments",
                "nul_character",
                "arguments must not contain NUL characters (\\u0000); remove them and call again",
            )
        return value

    def _validate(self, tool: Tool, args: dict) -> None:
        try:
            validator = Draft202012Validator(tool.input_schema)
            errors = sorted(
                validator.iter_errors(args), key=lambda e: (list(map(str, e.absolute_path)), e.message)
            )
        except Exception as exc:
            # A broken schema (e.g. from an MCP server) is the tool's fault, not the model's;
            # either way the call cannot be checked, so it does not run.
            logger.exception("input schema of tool %s cannot be applied", tool.name)
            raise _Refused(
                "validate", "invalid_schema", f"the tool's input schema is unusable: {type(exc).__name__}"
            ) from exc
        if not errors:
            return
        lines = [f"{_json_path(e.absolute_path)}: {_schema_message(e)}" for e in errors[:MAX_SCHEMA_ERRORS]]
        if len(errors) > MAX_SCHEMA_ERRORS:
            lines.append(f"(and {len(errors) - MAX_SCHEMA_ERRORS} more)")
        raise _Refused(
            "validate", "invalid_arguments", "arguments do not match the schema: " + "; ".join(lines)
        )

    def _approval(self, tool: Tool, args: dict, ctx: ToolContext, call_id: str, approved: bool) -> None:
        try:
            verdict = self.approval_hook(tool, args, ctx)
        except Exception as exc:
            # Fail closed: a broken policy check must not wave a call through.
            logger.exception("approval hook failed for tool %s (call %s)", tool.name, call_id)
            raise _Refused(
                "approval", "approval_error", f"approval check failed: {type(exc).__name__}"
            ) from exc
        action = str(getattr(verdict, "action", verdict))
        if action == PolicyAction.ALLOW:
            return
        if action == PolicyAction.REQUIRE_APPROVAL:
            if approved:
                return
            raise ApprovalRequired(tool, args, call_id, verdict)
        if action != PolicyAction.DENY:
            logger.error("approval hook returned %r for tool %s; treating as deny", verdict, tool.name)
        reason = str(getattr(verdict, "reason", "") or "").strip()
        message = f"the approval policy denies calling {tool.name!r}"
        raise _Refused("approval", "denied", f"{message}: {reason}" if reason else message)

    def _run_in_thread(self, prepared: _Prepared, ctx: ToolContext) -> ToolOutcome:
        """A pool thread's run: its own database connection (tools_find reads tool rows) is closed after."""
        from django.db import connection

        try:
            return self._run(prepared, ctx)
        finally:
            connection.close()

    def _run(self, prepared: _Prepared, ctx: ToolContext) -> ToolOutcome:
        """workspace_lease -> runtime -> normalize. Never raises (Exception subclasses)."""
        tool, args, call_id = prepared.tool, prepared.args, prepared.call_id
        call_ctx = dataclasses.replace(ctx, call_id=call_id)
        lease = None if tool.read_only else _lease_for(ctx.workspace)
        if lease is not None and not lease.acquire(timeout=self.lease_timeout):
            return self._error(
                call_id,
                tool.name,
                args,
                "workspace_lease",
                "workspace_busy",
                f"the workspace is busy with another writing tool (waited {self.lease_timeout:g}s)",
                prepared.started,
            )
        try:
            result = tool.run(call_ctx, args)
        except ToolError as exc:
            return self._error(call_id, tool.name, args, exc.stage, exc.code, str(exc), prepared.started)
        except SoftTimeLimitExceeded:
            # The runner slice's time is up (Celery's soft limit lands in whatever runs): not the
            # tool's failure, and the runner must see it to end the turn.
            raise
        except Exception as exc:
            logger.exception("tool %s crashed (call %s)", tool.name, call_id)
            return self._error(
                call_id,
                tool.name,
                args,
                "runtime",
                "tool_crashed",
                f"tool crashed: {type(exc).__name__}: {exc}",
                prepared.started,
            )
        finally:
            if lease is not None:
                lease.release()

        if isinstance(result, str):
            result = ToolResult(content=result)
        if not isinstance(result, ToolResult):
            logger.error("tool %s returned %s instead of a ToolResult", tool.name, type(result).__name__)
            return self._error(
                call_id,
                tool.name,
                args,
                "normalize",
                "invalid_result",
                f"tool returned {type(result).__name__} instead of a result",
                prepared.started,
            )
        if result.is_error:
            code = result.error_code or "tool_error"
            return self._error(call_id, tool.name, args, "runtime", code, result.content, prepared.started)
        content = result.content if isinstance(result.content, str) else str(result.content)
        return ToolOutcome(
            call_id=call_id,
            name=tool.name,
            arguments=args,
            ok=True,
            content=_cap(content, MAX_RESULT_CHARS),
            summary=_one_line(result.summary or content.split("\n", 1)[0] or tool.name),
            duration_ms=self._elapsed(prepared.started),
            data=result.data,
        )

    # --- helpers ------------------------------------------------------------------------

    @staticmethod
    def _elapsed(started: float) -> int:
        return round((time.monotonic() - started) * 1000)

    def _error(
        self,
        call_id: str,
        name: str,
        args: dict | None,
        stage: str,
        code: str,
        message: str,
        started: float,
    ) -> ToolOutcome:
        return ToolOutcome(
            call_id=call_id,
            name=name,
            arguments=args,
            ok=False,
            content=_cap(refusal_content(stage, code, message), MAX_RESULT_CHARS),
            summary=_one_line(f"{stage}: {message}"),
            error_code=code,
            stage=stage,
            duration_ms=self._elapsed(started),
        )
