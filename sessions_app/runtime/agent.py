"""AgentService: the fixed LLM/Tool loop of one turn, one step at a time (ARCHITECTURE §2).

A step: assemble the request from owner facts -> stream one model call -> either a final
answer (turn `completed`), a truncated answer (turn `max_tokens`, nothing executed), or tool
calls, each run through ToolService and committed with its result. AgentService keeps no
history of its own: every step starts from what SessionEngine has committed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from dataclasses import dataclass

from django.conf import settings

from config.parsers import json_depth_exceeds, json_max_depth
from tools_app.base import ToolContext, ToolError
from tools_app.catalog import resolve_available, sandbox_limits_for, tenant_tool_names
from tools_app.secrets import Redactor, StreamRedactor, tenant_secret_values
from tools_app.service import ApprovalRequired, ToolService

from ..choices import InputKind, TurnReason
from ..models import Message, Session, Turn
from . import engine
from .events import broadcast_delta
from .llm.base import Cancelled, CancelSignal, ModelCallFailed
from .llm.providers import provider_for

logger = logging.getLogger(__name__)

DELTA_FLUSH_S = 0.05
INTERRUPT_POLL_S = 0.25
HEARTBEAT_S = 10.0


def loop_guard_limits() -> tuple[int, int, int]:
    return (
        settings.XAGENT_LOOP_GUARD_REPEATS,
        settings.XAGENT_LOOP_GUARD_IDLE_ROUNDS,
        settings.XAGENT_MAX_STEPS_PER_TURN,
    )


class RuntimeSessionPort:
    """The SessionPort tools use: each call is a fenced SessionEngine operation."""

    def __init__(self, session_id, token):
        self.session_id, self.token = session_id, token

    def plan_create(self, title: str, tasks: list[str]) -> dict:
        return engine.plan_create(self.session_id, self.token, title, tasks)

    def plan_update(self, updates: list[dict]) -> dict:
        try:
            return engine.plan_update(self.session_id, self.token, updates)
        except ValueError as exc:  # the model's mistake (no plan, unknown id): a result it can read
            raise ToolError(str(exc), code="invalid_plan_update") from exc

    def task_complete(self, task_id: str, summary: str) -> dict:
        return self.plan_update([{"id": task_id, "status": "done"}])

    def file_changed(self, path: str, op: str) -> None:
        engine.file_changed(self.session_id, self.token, path, op)

    def capabilities(self) -> dict:
        return engine.session_capabilities(self.session_id)

    def add_capabilities(self, tools: list[str], toolsets: list[str]) -> dict:
        return engine.add_selected_capabilities(
            self.session_id, self.token, tools=tools, toolsets=toolsets, added_by="model"
        )


class InterruptWatcher:
    """Polls the queue for an interrupt while a model call or tool runs, and fires `cancel`.

    A thread (not the streaming loop) watches, so a model that sends nothing for a while is
    still cancelled within the poll interval.
    """

    def __init__(self, session_id, cancel: CancelSignal, heartbeat=None):
        self.session_id, self.cancel, self.heartbeat = session_id, cancel, heartbeat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"interrupt-watch-{session_id}", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self):
        from django.db import close_old_connections, connection

        try:
            last_beat = time.monotonic()
            while not self._stop.wait(INTERRUPT_POLL_S):
                if engine.queued_inputs(self.session_id, [InputKind.INTERRUPT]).exists():
                    self.cancel.set()
                    return
                if self.heartbeat is not None and time.monotonic() - last_beat >= HEARTBEAT_S:
                    # A long model call must not let the lease lapse (another runner would take over).
                    self.heartbeat()
                    last_beat = time.monotonic()
        except Exception:
            logger.warning("interrupt watcher for %s stopped", self.session_id, exc_info=True)
        finally:
            close_old_connections()
            connection.close()


class DeltaCoalescer:
    """Batches streamed text into one `model.delta` message per ~50 ms."""

    def __init__(self, session_id, model_call_id: int, redactor: Redactor | None = None):
        self.session_id, self.model_call_id = session_id, model_call_id
        self.buffer: list[str] = []
        self.last_flush = time.monotonic()
        # Holds back a tail so a secret split across deltas is still caught before it is sent.
        self.stream_redactor = StreamRedactor(redactor) if redactor else None

    def __call__(self, text: str) -> None:
        self.buffer.append(self.stream_redactor.feed(text) if self.stream_redactor else text)
        if time.monotonic() - self.last_flush >= DELTA_FLUSH_S:
            self.flush()

    def flush(self, final: bool = False) -> None:
        if final and self.stream_redactor is not None:
            self.buffer.append(self.stream_redactor.flush())
        if any(self.buffer):
            broadcast_delta(self.session_id, self.model_call_id, "".join(self.buffer))
            self.buffer.clear()
        self.last_flush = time.monotonic()


@dataclass
class StepResult:
    ended: str | None = None  # a TurnReason when the turn ended in this step
    suspended: bool = False  # parked on a pending approval
    detail: str = ""


def _signature(name: str, arguments: str) -> str:
    try:
        canonical = json.dumps(json.loads(arguments), sort_keys=True)
    except (ValueError, TypeError, RecursionError):
        canonical = arguments
    return hashlib.sha256(f"{name}\x00{canonical}".encode()).hexdigest()[:16]


class AgentService:
    def __init__(self, session_id, token, cancel: CancelSignal | None = None, heartbeat=None):
        self.session_id = session_id
        self.token = token
        self.cancel = cancel or CancelSignal()
        self.heartbeat = heartbeat
        from . import approvals

        self.tool_service = ToolService(approval_hook=approvals.approval_hook)

    def available_tools(self, session: Session) -> dict:
        """The native defaults plus what the Session's capabilities name, as this tenant allows."""
        capabilities = engine.session_capabilities(session.pk)
        return resolve_available(session.tenant_id, capabilities["tools"], capabilities["toolsets"])

    def step(self, turn_id: int) -> StepResult:
        session = Session.objects.get(pk=self.session_id)
        turn = Turn.objects.get(pk=turn_id)
        repeats_limit, idle_limit, max_steps = loop_guard_limits()
        if turn.steps >= max_steps:
            return self._end(
                turn_id, TurnReason.BLOCKED, f"loop guard: {max_steps} steps without finishing the task"
            )

        tools = self.available_tools(session)
        request = engine.assemble_request(self.session_id, [t.openai_schema() for t in tools.values()])
        call = engine.begin_model_call(self.session_id, self.token, turn_id, request)
        secrets = tenant_secret_values(session.tenant_id)
        redactor = Redactor(secrets.values())
        coalescer = DeltaCoalescer(self.session_id, call.pk, redactor)
        started = time.monotonic()
        try:
            with InterruptWatcher(self.session_id, self.cancel, self.heartbeat):
                result = provider_for(request.model).complete(
                    request.messages, request.tools, purpose="agent", on_delta=coalescer, cancel=self.cancel
                )
        except Cancelled:
            coalescer.flush(final=True)
            engine.end_model_call(
                self.session_id,
                self.token,
                call,
                finish_reason="cancelled",
                usage={},
                attempts=1,
                attempt_errors=[],
                latency_ms=_ms(started),
                error="interrupted by the user",
            )
            return StepResult()  # the runner applies the queued interrupt next
        except ModelCallFailed as exc:
            coalescer.flush(final=True)
            engine.end_model_call(
                self.session_id,
                self.token,
                call,
                finish_reason="error",
                usage={},
                attempts=exc.attempts,
                attempt_errors=exc.attempt_errors,
                latency_ms=_ms(started),
                error=str(exc),
            )
            return self._end(turn_id, TurnReason.ERROR, f"model call failed: {exc}")
        coalescer.flush(final=True)
        engine.end_model_call(
            self.session_id,
            self.token,
            call,
            finish_reason=result.finish_reason,
            usage=result.usage,
            attempts=result.attempts,
            attempt_errors=result.attempt_errors,
            latency_ms=_ms(started),
        )

        # What the model says is stored and shown redacted (a user may have pasted a secret);
        # the calls themselves run with the arguments as sent.
        text = redactor.redact(result.text)
        stored_calls = [{**c, "arguments": redactor.redact(c["arguments"])} for c in result.tool_calls]
        if result.finish_reason == "length":
            # A truncated response may hold a half-written tool call: nothing from it runs.
            engine.commit_assistant_message(self.session_id, self.token, turn_id, text, [])
            dropped = (
                f"; {len(result.tool_calls)} unfinished tool call(s) not executed"
                if result.tool_calls
                else ""
            )
            return self._end(turn_id, TurnReason.MAX_TOKENS, f"the model hit its output limit{dropped}")
        if not result.tool_calls:
            engine.commit_assistant_message(self.session_id, self.token, turn_id, text, [])
            return self._end(turn_id, TurnReason.COMPLETED)

        assistant = engine.commit_assistant_message(self.session_id, self.token, turn_id, text, stored_calls)
        for call_spec in result.tool_calls:
            engine.announce_tool_started(
                self.session_id,
                self.token,
                call_spec["id"],
                call_spec["name"],
                redactor.redact_data(_display_arguments(call_spec["arguments"])),
                turn_id=turn_id,
            )
        return self._run_calls(session, turn, assistant.pk, result.tool_calls, tools, secrets, redactor)

    def resume(self, turn_id: int, approval) -> StepResult:
        """Continue a turn parked on `approval` once it is decided: run the original call exactly once
        (approved) or commit the rejection as its result, then the calls that waited behind it."""
        from approvals_app import actions as approval_actions
        from approvals_app.choices import ApprovalStatus

        from . import approvals

        session = Session.objects.get(pk=self.session_id)
        turn = Turn.objects.get(pk=turn_id)
        tools = self.available_tools(session)
        secrets = tenant_secret_values(session.tenant_id)
        redactor = Redactor(secrets.values())
        spec = approvals.call_spec(approval, approval.call_id)
        if approval.status == ApprovalStatus.APPROVED:
            if approval_actions.do_claim_execution(approval):
                ctx = self._context(session, tools, secrets)
                outcome = self.tool_service.execute(
                    approval.call_id, spec["name"], json.dumps(approval.arguments), ctx, tools, approved=True
                )
                self._commit_outcome(turn_id, spec, outcome, redactor)
                approval_actions.do_record_execution(approval, redactor.redact(outcome.summary))
            elif not Message.objects.filter(
                session=session, role="tool", tool_call_id=approval.call_id
            ).exists():
                # Claimed by a runner that died before committing: never blindly re-run (§6).
                engine.commit_tool_result(
                    self.session_id,
                    self.token,
                    turn_id,
                    call_id=approval.call_id,
                    tool=spec["name"],
                    content="Interrupted: the approved call was started but its result was not recorded; "
                    "it was not run again.",
                    ok=False,
                    summary="interrupted",
                )
        else:
            engine.commit_tool_result(
                self.session_id,
                self.token,
                turn_id,
                call_id=approval.call_id,
                tool=spec["name"],
                content=approvals.rejection_text(approval),
                ok=False,
                summary=f"{approval.status} by a person",
            )
            approvals.mark_handled(approval)
        remaining = [approvals.call_spec(approval, call_id) for call_id in approval.remaining_call_ids]
        if remaining:
            return self._run_calls(
                session, turn, approval.assistant_message_id, remaining, tools, secrets, redactor
            )
        return StepResult()

    def _context(self, session, tools, secrets) -> ToolContext:
        return ToolContext(
            session_id=str(self.session_id),
            tenant_id=session.tenant_id,
            workspace=engine.workspace_path(session),
            port=RuntimeSessionPort(self.session_id, self.token),
            secrets=secrets,
            sandbox_limits=sandbox_limits_for(session.tenant_id) if "shell_exec" in tools else None,
        )

    def _commit_outcome(self, turn_id, call_spec, outcome, redactor) -> None:
        # Redaction is the last stage before anything is committed, shown or sent to the model.
        engine.commit_tool_result(
            self.session_id,
            self.token,
            turn_id,
            call_id=call_spec["id"],
            tool=call_spec["name"],
            content=redactor.redact(outcome.content),
            ok=outcome.ok,
            summary=redactor.redact(outcome.summary),
            source=_source(outcome),
        )

    def _run_calls(
        self, session, turn, assistant_message_id, call_specs, tools, secrets, redactor
    ) -> StepResult:
        """Run calls of one response in model order; a call needing approval parks the turn."""
        from . import approvals

        repeats_limit, idle_limit, _ = loop_guard_limits()
        turn_id = turn.pk
        guard = dict(turn.guard_state)
        progressed = False
        ctx = self._context(session, tools, secrets)
        self.tool_service.known_tools = tenant_tool_names(session.tenant_id)
        # Consecutive read-only calls run in parallel; results still commit in model order.
        outcomes = self.tool_service.execute_batch(
            [(c["id"], c["name"], c["arguments"]) for c in call_specs], ctx, tools
        )
        for index, call_spec in enumerate(call_specs):
            if self.cancel.is_set() or engine.queued_inputs(self.session_id, [InputKind.INTERRUPT]).exists():
                outcomes.close()  # calls not yet started never start
                # Every tool call in history keeps a result, so the next request stays valid.
                engine.commit_tool_result(
                    self.session_id,
                    self.token,
                    turn_id,
                    call_id=call_spec["id"],
                    tool=call_spec["name"],
                    content="Not run: the user interrupted the turn.",
                    ok=False,
                    summary="cancelled by interrupt",
                )
                continue
            try:
                outcome = next(outcomes)
            except ApprovalRequired as required:
                approvals.suspend(
                    self.session_id,
                    self.token,
                    turn_id=turn_id,
                    assistant_message_id=assistant_message_id,
                    tool=required.tool,
                    call_id=call_spec["id"],
                    arguments=required.arguments,
                    remaining_call_ids=[c["id"] for c in call_specs[index + 1 :]],
                    redactor=redactor,
                    verdict=required.verdict,
                )
                return StepResult(suspended=True)
            self._commit_outcome(turn_id, call_spec, outcome, redactor)
            if outcome.ok:
                progressed = True
                guard["repeats"] = 0
                guard["failure_signature"] = ""
            else:
                signature = _signature(call_spec["name"], call_spec["arguments"])
                guard["repeats"] = (
                    guard.get("repeats", 0) + 1 if guard.get("failure_signature") == signature else 1
                )
                guard["failure_signature"] = signature
        guard["idle_rounds"] = 0 if progressed else guard.get("idle_rounds", 0) + 1
        engine.record_step(self.session_id, self.token, turn_id, guard)
        if guard.get("repeats", 0) >= repeats_limit:
            return self._end(
                turn_id,
                TurnReason.BLOCKED,
                f"loop guard: the same failing tool call was repeated {guard['repeats']} times",
            )
        if guard["idle_rounds"] >= idle_limit:
            return self._end(
                turn_id,
                TurnReason.BLOCKED,
                f"loop guard: {guard['idle_rounds']} rounds of tool calls without progress",
            )
        return StepResult()

    def _end(self, turn_id: int, reason: str, detail: str = "") -> StepResult:
        engine.finish_turn(self.session_id, self.token, turn_id, reason, detail)
        return StepResult(ended=reason, detail=detail)


def _source(outcome) -> dict | None:
    data = getattr(outcome, "data", None) or {}
    return {"server": data["server"], "tool": data["tool"]} if "server" in data and "tool" in data else None


def _display_arguments(raw: str):
    # Too deep to show as data (and to store as an event's JSON): show the start of the text.
    if isinstance(raw, str) and json_depth_exceeds(raw, json_max_depth()):
        return {"_raw": raw[:2000]}
    try:
        return json.loads(raw)
    except (ValueError, TypeError, RecursionError):
        return {"_raw": raw[:2000]}


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
