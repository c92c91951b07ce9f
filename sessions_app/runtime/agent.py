"""AgentService: the fixed LLM/Tool loop of one turn, one step at a time (ARCHITECTURE §2).

One AgentService serves one runner slice. The slice reads its context once (`SliceContext`:
the Session's facts, model, tools, secrets, policy rules and the request history) and each
step is three kinds of commit (SessionEngine's step phases, each fenced by the lease):
  (a) begin — the model-call record of what is sent, the step count, `model.started`; it also
      proves nothing the slice cached changed, or the slice re-reads (`StaleSlice`);
  (b) end — the call's result, the assistant message and `tool.started` of each call;
  (c) one commit per finished tool call (its result message and `tool.ended`).
A step ends with a final answer (turn `completed`), a truncated answer (turn `max_tokens`,
nothing executed), or tool calls, each run through ToolService. AgentService keeps no history
of its own beyond the slice: the next slice starts from what SessionEngine has committed.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import dataclass

from django.conf import settings

from config.dbconn import hand_back_connections
from config.parsers import json_depth_exceeds, json_max_depth
from tools_app.service import ApprovalRequired, ToolService

from ..choices import TurnReason
from ..models import Message
from . import approvals, engine, summary, watch
from .llm.base import Cancelled, CancelSignal, ModelCallFailed, ModelResult
from .llm.providers import provider_for
from .llm.tokens import (
    estimate_message_tokens,
)
from .slice_context import SliceContext
from .streaming import DeltaCoalescer

logger = logging.getLogger(__name__)


def loop_guard_limits() -> tuple[int, int, int]:
    return (
        settings.XAGENT_LOOP_GUARD_REPEATS,
        settings.XAGENT_LOOP_GUARD_IDLE_ROUNDS,
        settings.XAGENT_MAX_STEPS_PER_TURN,
    )


@dataclass
class StepResult:
    ended: str | None = None  # a TurnReason when the turn ended in this step
    suspended: bool = False  # parked on a pending approval
    compacted: bool = False  # the step compacted the context instead of calling the model
    detail: str = ""
    followups: bool = False  # the turn's end has follow-ups above the engine (engine.end_turn)
    quota_spent: object = None  # a spent quota (quotas.Exceeded) stopped the step before its call


def _signature(name: str, arguments: str) -> str:
    try:
        canonical = json.dumps(json.loads(arguments), sort_keys=True)
    except (ValueError, TypeError, RecursionError):
        canonical = arguments
    return hashlib.sha256(f"{name}\x00{canonical}".encode()).hexdigest()[:16]


class AgentService:
    def __init__(self, session_id, token, *, holds_lease: bool = False):
        """`holds_lease`: the slice holds the Session's runner lease (Brain's runner), so the
        process's watcher extends it while the slice works."""
        self.session_id, self.token, self.holds_lease = session_id, token, holds_lease
        self.context = SliceContext.for_slice(session_id, token)
        self.cancel = CancelSignal()
        self._watcher: watch.Watched | None = None
        self.tool_service = ToolService(approval_hook=self.context.approval_verdict)

    # --- the slice's life -----------------------------------------------------------------------

    @property
    def current(self) -> bool:
        """True while the slice's context may be used without re-reading (see SliceContext)."""
        return self.context.current

    def prepare(self, turn_id: int, started=None) -> None:
        """At a step boundary: (re-)read what changed, for the turn `turn_id` (`started`: the turn
        `engine.start_turn` just returned, see `SliceContext.refresh`)."""
        self.context.refresh(turn_id, started)
        self.tool_service.known_tools = self.context.known_tools

    def invalidate(self) -> None:
        if self.context.writer is not None:
            self.context.writer.forget()

    def interrupted(self) -> None:
        """An interrupt was applied: later steps (a next turn) start with a fresh signal."""
        self._stop_watching()
        self.cancel = CancelSignal()
        self.invalidate()

    def pause(self) -> None:
        """Before the slice releases (or offers to release) its lease: stop watching, write the
        turn's step count and loop-guard memory; a slice that goes on re-reads first."""
        self._stop_watching()
        context = self.context
        try:
            if (
                context.turn_id is not None
                and context.writer is not None
                and context.progress != context.progress_saved
            ):
                engine.save_progress(context.writer, context.turn_id, context.progress)
                context.progress_saved = copy.deepcopy(context.progress)
        except engine.LeaseLost:
            pass
        finally:
            self.invalidate()

    def close(self) -> None:
        """End of the slice: pause, and keep the context for this Session's next slice here."""
        self.pause()
        if self.context.writer is not None:
            self.context.keep()

    def watch_interrupts(self) -> None:
        """Until the slice pauses: an interrupt sets `cancel`, and the lease is kept alive. What
        follows (a turn's preparation) counts as a step for the step time limit."""
        self._step_starts()

    def _watch(self) -> None:
        if self._watcher is None:
            self._watcher = watch.watch(self.session_id, self.token, self.cancel, beats=self.holds_lease)

    def _stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def _stopped_because(self) -> str:
        """Why the watcher stopped this step itself (time limit, lost lease); "" for an interrupt."""
        return self._watcher.stopped_because if self._watcher is not None else ""

    def _step_starts(self) -> None:
        """The per-step time limit (XAGENT_STEP_TIME_LIMIT) counts from here."""
        self._watch()
        self._watcher.step_started_now()

    # --- one step -------------------------------------------------------------------------------

    def step(self) -> StepResult:
        """One step of the prepared turn. Raises StaleSlice (nothing done) when the slice must
        re-read first."""
        context = self.context
        turn_id = context.turn_id
        self._step_starts()
        _, _, max_steps = loop_guard_limits()
        if context.progress.steps >= max_steps:
            return self._end(TurnReason.BLOCKED, f"loop guard: {max_steps} steps without finishing the task")

        spent = context.quota_spent()
        if spent is not None:
            # Checked before every call (a compaction's summary included): the turn waits, open.
            return StepResult(quota_spent=spent)
        request = context.request()
        if (
            request.estimated_tokens > context.budget
            and context.compaction_blocked_at != context.history.last_id
        ):
            if self._compact(request):
                return StepResult(compacted=True)
        call = engine.begin_model_call(context.writer, turn_id, request)
        context.progress.steps += 1
        redactor = context.redactor
        coalescer = DeltaCoalescer(self.session_id, call.pk, redactor)
        started = time.monotonic()
        hand_back_connections()  # the stream is a wait: the process's few connections serve others
        try:
            result = provider_for(request.model).complete(
                request.messages, request.tools, purpose="agent", on_delta=coalescer, cancel=self.cancel
            )
        except Cancelled:
            coalescer.flush(final=True)
            stopped = self._stopped_because()
            engine.end_model_call(
                context.writer,
                call,
                engine.CallOutcome(
                    "cancelled", {}, 1, [], _ms(started), error=stopped or "interrupted by the user"
                ),
            )
            if stopped:
                return self._end(TurnReason.ERROR, stopped)
            self.invalidate()  # the runner applies the queued interrupt next
            return StepResult()
        except ModelCallFailed as exc:
            coalescer.flush(final=True)
            engine.end_model_call(
                context.writer,
                call,
                engine.CallOutcome(
                    "error", {}, exc.attempts, exc.attempt_errors, _ms(started), error=str(exc)
                ),
            )
            return self._end(TurnReason.ERROR, f"model call failed: {exc}")
        coalescer.flush(final=True)
        context.calibrate(request, result.usage)
        outcome = engine.CallOutcome(
            result.finish_reason, result.usage, result.attempts, result.attempt_errors, _ms(started)
        )

        # What the model says is stored and shown redacted (a user may have pasted a secret);
        # the calls themselves run with the arguments as sent.
        text = redactor.redact(result.text)
        if result.finish_reason == "length" or not result.tool_calls:
            # A truncated response may hold a half-written tool call: nothing from it runs.
            self._commit_answer(call, outcome, text, [])
            if result.finish_reason == "length":
                dropped = (
                    f"; {len(result.tool_calls)} unfinished tool call(s) not executed"
                    if result.tool_calls
                    else ""
                )
                return self._end(TurnReason.MAX_TOKENS, f"the model hit its output limit{dropped}")
            return self._end(TurnReason.COMPLETED)

        stored_calls = [{**c, "arguments": redactor.redact(c["arguments"])} for c in result.tool_calls]
        announced = [
            {
                "call_id": c["id"],
                "tool": c["name"],
                "arguments": redactor.redact_data(_display_arguments(c["arguments"])),
            }
            for c in result.tool_calls
        ]
        assistant = self._commit_answer(call, outcome, text, stored_calls, announced)
        return self._run_calls(assistant.pk, result.tool_calls)

    def _compact(self, request: engine.AssembledRequest) -> bool:
        """The request is over budget: compact the sealed earlier steps (ARCHITECTURE §5) and let
        the runner re-read. False when no legal boundary can cut anything (the request is sent
        as it is; the compaction is not retried until history grows)."""
        context = self.context
        plan = engine.plan_compaction(
            context.history, budget=context.budget, fixed_tokens=context.fixed_tokens
        )
        if plan is None:
            context.compaction_blocked_at = context.history.last_id
            return False
        state_budget = engine.state_budget(context.budget)
        messages = summary.summary_request(
            goals={"session_goal": context.session.session_goal, "phase_goal": context.session.phase_goal},
            previous_state=context.continuity_state,
            span=plan.span,
            input_budget_tokens=context.budget - state_budget,
        )
        checkpoint, _ = engine.begin_compaction(
            self.session_id,
            self.token,
            turn_id=context.turn_id,
            plan=plan,
            budget=context.budget,
            model=context.model,
            system_prompt_blob_id=engine.prompt_blob(
                context.session.tenant_id, "summary_prompt", summary.INSTRUCTIONS
            ),
            request_tokens=sum(estimate_message_tokens(m) for m in messages),
        )
        self.invalidate()  # whatever happens next, the slice re-reads its history
        kept = sum(context.history.tokens[plan.start_index :])
        self._watch()
        try:
            state, result = summary.summarize(
                context.model, messages, max_tokens=state_budget, cancel=self.cancel
            )
        except engine.LeaseLost:
            raise  # the next lease holder settles the pending checkpoint
        except (Cancelled, ModelCallFailed, summary.SummaryInvalid) as exc:
            return self._summary_failed(checkpoint, exc, kept)
        except Exception as exc:
            # A crash of our own: never leave the Session `compressing` behind it.
            engine.abandon_compaction(
                self.session_id, self.token, checkpoint, reason=f"internal error: {exc!r}"
            )
            raise
        engine.record_summary(self.session_id, self.token, checkpoint, result=result, state=state)
        state_tokens = estimate_message_tokens({"content": engine.continuity_text(state)})
        engine.commit_compaction(
            self.session_id, self.token, checkpoint, tokens_after=context.fixed_tokens + kept + state_tokens
        )
        return True

    def _summary_failed(self, checkpoint, exc: Exception, kept: int) -> bool:
        """Interrupted: the compaction is dropped (the interrupt applies next). Failed or invalid:
        a deterministic trim at the same boundary, and the event says why."""
        if isinstance(exc, Cancelled):
            engine.abandon_compaction(
                self.session_id, self.token, checkpoint, reason="interrupted by the user"
            )
            return True
        reason = (
            f"summary call failed: {exc}" if isinstance(exc, ModelCallFailed) else f"invalid summary: {exc}"
        )
        engine.record_summary(
            self.session_id,
            self.token,
            checkpoint,
            result=getattr(exc, "result", None) or _failed_call(exc),
            state=None,
            error=reason,
        )
        engine.fall_back_to_trim(
            self.session_id,
            self.token,
            checkpoint,
            reason=reason,
            previous_state=self.context.continuity_state,
            tokens_after=self.context.fixed_tokens + kept,
        )
        return True

    def _commit_answer(self, call, outcome, text, stored_calls, announced=()) -> Message:
        context = self.context
        message = engine.end_model_call(
            context.writer,
            call,
            outcome,
            turn_id=context.turn_id,
            answer=(text, stored_calls),
            announced=list(announced),
        )
        context.history.add(message)
        return message

    def resume(self, approval) -> StepResult:
        """Continue a turn parked on `approval` once it is decided: run the original call exactly once
        (approved) or commit the rejection as its result, then the calls that waited behind it."""
        from approvals_app import actions as approval_actions
        from approvals_app.choices import ApprovalStatus

        context = self.context
        spec = approvals.call_spec(approval, approval.call_id)
        if approval.status == ApprovalStatus.APPROVED:
            if approval_actions.do_claim_execution(approval):
                self._step_starts()  # the approved call runs watched: interrupts, lease, time limit
                hand_back_connections()
                outcome = self.tool_service.execute(
                    approval.call_id,
                    spec["name"],
                    json.dumps(approval.arguments),
                    dataclasses.replace(context.tool_context, cancel=self.cancel.event),
                    context.tools,
                    approved=True,
                )
                self._commit_outcome(spec, outcome)
                approval_actions.do_record_execution(approval, context.redactor.redact(outcome.summary))
            elif not Message.objects.filter(
                session_id=self.session_id, role="tool", tool_call_id=approval.call_id
            ).exists():
                # Claimed by a runner that died before committing: never blindly re-run (§6).
                self._commit_result(
                    approval.call_id,
                    spec["name"],
                    "Interrupted: the approved call was started but its result was not recorded; "
                    "it was not run again.",
                    ok=False,
                    summary="interrupted",
                )
        else:
            self._commit_result(
                approval.call_id,
                spec["name"],
                approvals.rejection_text(approval),
                ok=False,
                summary=approvals.outcome_summary(approval),
            )
            approval_actions.do_mark_handled(approval)  # its rejection is now its result
        remaining = [approvals.call_spec(approval, call_id) for call_id in approval.remaining_call_ids]
        if remaining:
            return self._run_calls(approval.assistant_message_id, remaining)
        return StepResult()

    def run_pending_calls(self) -> bool:
        """Run the calls of the turn's last response that have no result yet — only recovery
        leaves such calls (a read-only or idempotent call its lost runner had dispatched, and
        what came after it) — through ToolService exactly like a step's calls, approvals
        included. False (and no query) when there are none."""
        context = self.context
        if not engine.has_unanswered_calls(context.history.messages):
            return False
        found = engine.unanswered_calls(context.turn_id)
        if found is None:
            return False
        assistant_message_id, calls = found
        self._step_starts()
        self._run_calls(assistant_message_id, calls)
        return True

    def _commit_result(self, call_id, tool, content, *, ok, summary, source=None) -> None:
        context = self.context
        message = engine.commit_tool_result(
            context.writer,
            context.turn_id,
            call_id=call_id,
            tool=tool,
            content=content,
            ok=ok,
            summary=summary,
            source=source,
        )
        context.history.add(message)

    def _commit_outcome(self, call_spec, outcome) -> None:
        # Redaction is the last stage before anything is committed, shown or sent to the model.
        redactor = self.context.redactor
        self._commit_result(
            call_spec["id"],
            call_spec["name"],
            redactor.redact(outcome.content),
            ok=outcome.ok,
            summary=redactor.redact(outcome.summary),
            source=_source(outcome),
        )

    def _run_calls(self, assistant_message_id, call_specs) -> StepResult:
        """Run calls of one response in model order; a call needing approval parks the turn."""
        context = self.context
        repeats_limit, idle_limit, _ = loop_guard_limits()
        guard = context.progress.guard_state
        progressed = False
        # Consecutive read-only calls run in parallel; results still commit in model order. An
        # interrupt (or the step's time limit) also stops a running sandboxed command.
        tool_context = dataclasses.replace(context.tool_context, cancel=self.cancel.event)
        hand_back_connections()  # tools mostly wait (sandbox, MCP); they take a connection if they need one
        outcomes = self.tool_service.execute_batch(
            [(c["id"], c["name"], c["arguments"]) for c in call_specs], tool_context, context.tools
        )
        for index, call_spec in enumerate(call_specs):
            if self.cancel.is_set():
                outcomes.close()  # calls not yet started never start
                # Every tool call in history keeps a result, so the next request stays valid.
                self._commit_result(
                    call_spec["id"],
                    call_spec["name"],
                    "Not run: the user interrupted the turn.",
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
                    turn_id=context.turn_id,
                    assistant_message_id=assistant_message_id,
                    tool=required.tool,
                    call_id=call_spec["id"],
                    arguments=required.arguments,
                    remaining_call_ids=[c["id"] for c in call_specs[index + 1 :]],
                    redactor=context.redactor,
                    verdict=required.verdict,
                )
                self.invalidate()
                return StepResult(suspended=True)
            self._commit_outcome(call_spec, outcome)
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
        if self.cancel.is_set():
            stopped = self._stopped_because()
            if stopped:
                return self._end(TurnReason.ERROR, stopped)
            self.invalidate()  # the runner applies the queued interrupt next
        guard["idle_rounds"] = 0 if progressed else guard.get("idle_rounds", 0) + 1
        if guard.get("repeats", 0) >= repeats_limit:
            return self._end(
                TurnReason.BLOCKED,
                f"loop guard: the same failing tool call was repeated {guard['repeats']} times",
            )
        if guard["idle_rounds"] >= idle_limit:
            return self._end(
                TurnReason.BLOCKED,
                f"loop guard: {guard['idle_rounds']} rounds of tool calls without progress",
            )
        return StepResult()

    def _end(self, reason: str, detail: str = "") -> StepResult:
        context = self.context
        followups = engine.finish_turn(
            self.session_id,
            self.token,
            context.turn_id,
            reason,
            detail,
            progress=context.progress,
            redactor=context.redactor,
            turn=context.turn,
        )
        context.progress_saved = copy.deepcopy(context.progress)
        self.invalidate()
        return StepResult(ended=reason, detail=detail, followups=followups)


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


def _failed_call(exc: Exception) -> ModelResult:
    """The evidence of a call that never answered: its attempts and their errors."""
    return ModelResult(
        finish_reason="error",
        attempts=getattr(exc, "attempts", 1),
        attempt_errors=list(getattr(exc, "attempt_errors", [])),
    )


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
