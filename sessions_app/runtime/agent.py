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
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from django.conf import settings

from approvals_app import policy as approval_policy
from config.dbconn import hand_back_connections
from config.parsers import json_depth_exceeds, json_max_depth
from skills_app import catalog as skills_catalog
from tools_app.base import ToolContext, ToolError
from tools_app.catalog import resolve_available, sandbox_limits_for, tenant_tool_names
from tools_app.registry import DELEGATE_TOOL
from tools_app.secrets import Redactor, StreamRedactor, bound_shell_environment, tenant_secret_values
from tools_app.service import ApprovalRequired, ToolService

from ..choices import CallPurpose, InputKind, SessionKind, TurnReason
from ..models import Checkpoint, Message, ModelCall, Plan, Session, Turn
from . import approvals, engine, memory, summary, watch
from .events import broadcast_delta
from .llm.base import Cancelled, CancelSignal, ModelCallFailed, ModelResult
from .llm.config import EffectiveModel, resolve_model
from .llm.providers import provider_for
from .llm.tokens import (
    Calibration,
    context_budget,
    estimate_message_tokens,
    estimate_text_tokens,
    estimate_tools_tokens,
)

logger = logging.getLogger(__name__)

DELTA_FLUSH_S = 0.05
# Loaded Skills' instructions may take at most this share of the context budget together.
SKILL_SHARE_OF_BUDGET = 0.25


def loop_guard_limits() -> tuple[int, int, int]:
    return (
        settings.XAGENT_LOOP_GUARD_REPEATS,
        settings.XAGENT_LOOP_GUARD_IDLE_ROUNDS,
        settings.XAGENT_MAX_STEPS_PER_TURN,
    )


class RuntimeSessionPort:
    """The SessionPort tools use: each call is a fenced SessionEngine operation of the slice."""

    def __init__(self, context: SliceContext):
        self.context = context

    def plan_create(self, title: str, tasks: list[str]) -> dict:
        plan = engine.plan_create(self.context.writer, title, tasks)
        self.context.plan_changed(plan)
        return plan

    def plan_update(self, updates: list[dict]) -> dict:
        try:
            plan = engine.plan_update(self.context.writer, updates)
        except ValueError as exc:  # the model's mistake (no plan, unknown id): a result it can read
            raise ToolError(str(exc), code="invalid_plan_update") from exc
        self.context.plan_changed(plan)
        return plan

    def task_complete(self, task_id: str, summary: str) -> dict:
        return self.plan_update([{"id": task_id, "status": "done"}])

    def file_changed(self, path: str, op: str) -> None:
        # A name is a program's to choose: one a secret went into is announced masked.
        engine.file_changed(self.context.writer, self.context.redactor.redact(path), op)

    def capabilities(self) -> dict:
        return engine.session_capabilities(self.context.session_id)

    def add_capabilities(self, tools: list[str], toolsets: list[str]) -> dict:
        added = engine.add_selected_capabilities(
            self.context.session_id, self.context.token, tools=tools, toolsets=toolsets, added_by="model"
        )
        self.context.writer.forget()  # new tools: the next step re-reads them
        return added

    def load_skills(self, refs: list[str]) -> dict:
        """Attach Skills (add-only): their bodies are in every request from the next step on."""
        context = self.context
        decision = skills_catalog.choose_to_load(
            context.session.tenant_id,
            refs,
            loaded_now=context.loaded_skills,
            room_tokens=int(context.budget * SKILL_SHARE_OF_BUDGET),
            cost=estimate_text_tokens,
        )
        added = {"skills": []}
        if decision.accepted:
            added = engine.add_selected_capabilities(
                context.session_id,
                context.token,
                skills=[skill.name for skill in decision.accepted],
                added_by="model",
            )
            context.writer.forget()  # the next step re-reads its Skills
            # Calls later in this step may already read their resources.
            context.loaded_skill_names = [*context.loaded_skill_names, *added["skills"]]
        return decision.result(added["skills"])

    def loaded_skill_names(self) -> list[str]:
        return list(self.context.loaded_skill_names)

    def _memory_user(self) -> int:
        if self.context.memory_user_id is None:
            raise ToolError(
                "memory is personal to the Session's owner, and someone else wrote into this task: "
                "no memory is read or saved for it",
                code="memory_unavailable",
            )
        return self.context.memory_user_id

    def memory_save(self, text: str, kind: str) -> dict:
        session = self.context.session
        try:
            saved, created = memory.save(
                tenant_id=session.tenant_id,
                user_id=self._memory_user(),
                text=text,
                kind=kind,
                source_session_id=session.pk,
            )
        except memory.MemoryRefused as exc:
            raise ToolError(str(exc), code="memory_refused") from exc
        return {**memory.as_dict(saved), "created": created}

    def delegate(self, *, request: str, files: list[str], session_id, title: str, call_id: str) -> dict:
        """Hand a task to a sub-Session (a MainSession's coordinator tool); its runner is woken
        once the input is committed."""
        return engine.delegate(
            self.context.session_id,
            request=request,
            files=files,
            sub_session_id=session_id,
            title=title,
            call_id=call_id,
        )

    def memory_search(self, query: str, kind: str | None, limit: int) -> list[dict]:
        session = self.context.session
        found = memory.search(
            tenant_id=session.tenant_id, user_id=self._memory_user(), query=query, kind=kind, limit=limit
        )
        return [memory.as_dict(m) for m in found]

    # --- MCP elicitation: SessionEngine's input requests (engine/elicitation.py) ---------------
    # These run in the MCP client's worker thread while the step waits on the tool call; events
    # they write move the Session's seq, so the slice's writer re-reads it at its next commit.

    def request_input(
        self, *, call_id: str, server: str, tool: str, message: str, schema: dict, timeout_seconds: float
    ) -> int:
        request = engine.request_input(
            self.context.session_id,
            self.context.token,
            call_id=call_id,
            server=server,
            tool=tool,
            message=message,
            schema=schema,
            timeout_seconds=timeout_seconds,
        )
        self.context.writer.forget()
        return request.pk

    def input_answer(self, request_id: int) -> dict | None:
        return engine.input_answer(request_id)

    def close_input(self, request_id: int, *, expired: bool) -> dict:
        engine.close_input(request_id, expired=expired)
        self.context.writer.forget()
        return engine.input_answer(request_id) or {"status": "pending", "action": "decline", "content": None}

    def interrupted(self) -> bool:
        return engine.queued_inputs(self.context.session_id, [InputKind.INTERRUPT]).exists()


class SliceContext:
    """What a runner slice reads once and reuses step after step: the Session's facts, its
    model, tools, secrets, policy rules and the request history.

    `refresh` reads (again) at a step boundary: configuration only when its versions changed,
    history only from the last message it has. Between boundaries, each step's opening commit
    proves the versions still hold (`RunnerWriter`), so nothing here is re-read per step.
    """

    def __init__(self, session_id):
        self.session_id = session_id
        self.token = None
        self.writer: engine.RunnerWriter | None = None
        self.history = engine.RequestHistory()
        self.session: Session | None = None
        self.turn_id: int | None = None
        self.progress = engine.TurnProgress()
        self.progress_saved = engine.TurnProgress()
        self.plan: dict | None = None
        self._configuration_key = None
        self._system_text = None
        # Compaction: the committed checkpoint's state, the active turn's anchor, what the
        # provider last reported, and the history position a compaction could not cut.
        self.checkpoint_id: int | None = None
        self.continuity_state: dict | None = None
        self._anchor_key = None
        self.anchor_id: int | None = None
        self.model: EffectiveModel | None = None
        self.calibration: Calibration | None = None
        self.compaction_blocked_at: int | None = None
        # Skills loaded (configuration; the offered ones only as prompt text) and the memories
        # recalled for the turn.
        self.loaded_skills: list = []
        self.memories: list = []
        self.memory_user_id: int | None = None
        self._skills_text = ""
        self.loaded_skill_names: list[str] = []

    @classmethod
    def for_slice(cls, session_id, token) -> SliceContext:
        """The context this process kept from the Session's last slice, if any (history is
        append-only and configuration carries its versions, so it only needs catching up)."""
        with _kept_lock:
            context = _kept_contexts.pop(str(session_id), None)
        context = context or cls(session_id)
        context.token, context.writer = token, None
        return context

    def keep(self) -> None:
        """Hand the context to this Session's next slice in this process. A slice takes it and
        keeps it back when it ends, so two slices never share one."""
        self.writer = None
        with _kept_lock:
            _kept_contexts[str(self.session_id)] = self
            _kept_contexts.move_to_end(str(self.session_id))
            while len(_kept_contexts) > MAX_KEPT_CONTEXTS:
                _kept_contexts.popitem(last=False)

    @property
    def current(self) -> bool:
        return self.writer is not None and self.writer.current and self.turn_id is not None

    def refresh(self, turn_id: int) -> None:
        session = Session.objects.select_related("model_config", "tenant").get(pk=self.session_id)
        tenant_version = session.tenant.config_version
        if self.writer is None:
            self.writer = engine.RunnerWriter(self.session_id, self.token, session.tenant_id)
            self.turn_id = None  # a new slice re-reads the turn's progress
        self.session = session
        key = (session.config_version, tenant_version, session.model_config_id)
        if key != self._configuration_key:
            self._read_configuration(session)
            self._configuration_key = key
        if turn_id != self.turn_id or not self.writer.current:
            turn = Turn.objects.only("steps", "guard_state", "recalled_memory_ids").get(pk=turn_id)
            self.turn_id = turn_id
            self.progress = engine.TurnProgress(turn.steps, dict(turn.guard_state))
            self.progress_saved = engine.TurnProgress(turn.steps, dict(turn.guard_state))
            self.memory_user_id = engine.memory_user_id(session, engine.turn_author_ids(turn_id))
            self.memories = memory.texts(session.tenant_id, self.memory_user_id, turn.recalled_memory_ids)
        plan = Plan.objects.filter(session_id=self.session_id).prefetch_related("tasks").first()
        self.plan = plan.as_dict() if plan is not None else None
        self._read_compaction(session, turn_id)
        self.history.catch_up(self.session_id, session.context_start_message_id, self.anchor_id)
        self._update_system_prompt()
        self.writer.observe(
            last_event_seq=session.last_event_seq,
            config_version=session.config_version,
            tenant_config_version=tenant_version,
        )

    def _read_compaction(self, session: Session, turn_id: int) -> None:
        """The last compaction's continuity state, and the turn's anchor: its user request when
        the context start has moved past it (it is sent right after the system prompt)."""
        if session.context_checkpoint_id != self.checkpoint_id:
            self.checkpoint_id = session.context_checkpoint_id
            self.continuity_state = (
                Checkpoint.objects.filter(pk=self.checkpoint_id).values_list("state", flat=True).first()
                if self.checkpoint_id
                else None
            )
        key = (turn_id, session.context_start_message_id)
        if key != self._anchor_key:
            self._anchor_key = key
            start = session.context_start_message_id
            request = engine.turn_request(turn_id) if start else None
            self.anchor_id = request.pk if request is not None and request.pk < start else None
        if self.calibration is None:
            # Calibrated per model: only this model's last report counts.
            last = (
                ModelCall.objects.filter(
                    session_id=self.session_id,
                    purpose=CallPurpose.AGENT,
                    model=self.model.model,
                    prompt_tokens__gt=0,
                )
                .order_by("-id")
                .values("prompt_tokens", "estimated_prompt_tokens", "fact_versions")
                .first()
            )
            facts = (last or {}).get("fact_versions") or {}
            self.calibration = Calibration(
                reported=(last or {}).get("prompt_tokens", 0),
                estimated=facts.get("local_estimate") or (last or {}).get("estimated_prompt_tokens", 0),
                context_start_id=facts.get("context_start_message_id"),
            )

    def _read_configuration(self, session: Session) -> None:
        tenant_id = session.tenant_id
        model = resolve_model(session)
        if self.model is None or (model.base_url, model.model) != (self.model.base_url, self.model.model):
            self.calibration = None  # another model counts differently
        self.model = model
        self.budget = context_budget(self.model.context_window, self.model.max_output_tokens)
        capabilities = engine.session_capabilities(session.pk)
        # A MainSession coordinates: it may hand tasks to sub-Sessions (which may not).
        coordinator = session.kind == SessionKind.MAIN
        self.tools = resolve_available(
            tenant_id,
            [*capabilities["tools"], *([DELEGATE_TOOL] if coordinator else [])],
            capabilities["toolsets"],
        )
        if not coordinator:
            # Not even through a tool set an admin put it in: only a MainSession delegates.
            self.tools.pop(DELEGATE_TOOL, None)
        self.loaded_skills = skills_catalog.loaded(tenant_id, capabilities["skills"])
        self.loaded_skill_names = [skill.name for skill in self.loaded_skills]
        offered, more = skills_catalog.offered(tenant_id, exclude=self.loaded_skill_names)
        self._skills_text = engine.skills_text(offered, more, self.loaded_skills)
        self.tool_schemas = [tool.openai_schema() for tool in self.tools.values()]
        self.tool_schemas_blob_id = engine.prompt_blob(
            tenant_id, "tool_schemas", json.dumps(self.tool_schemas, sort_keys=True)
        )
        self.tools_tokens = estimate_tools_tokens(self.tool_schemas)
        self.known_tools = tenant_tool_names(tenant_id)
        secrets = tenant_secret_values(tenant_id)
        # Every value of the tenant, bound in this Session or not: a model may echo any it saw.
        self.redactor = Redactor(secrets.values())
        self.policy_rules = approval_policy.tenant_rules(tenant_id)
        shell = "shell_exec" in self.tools
        # Only what admins wrote (the tool sets' shell environments) carries a secret into a
        # process, never the model's arguments (ARCHITECTURE §7).
        bound = bound_shell_environment(tenant_id, capabilities["toolsets"], secrets) if shell else None
        self.tool_context = ToolContext(
            session_id=str(self.session_id),
            tenant_id=tenant_id,
            workspace=engine.workspace_path(session),
            port=RuntimeSessionPort(self),
            env=bound.env if bound else {},
            env_problem=bound.problem if bound else "",
            sandbox_limits=sandbox_limits_for(tenant_id) if shell else None,
        )

    def plan_changed(self, plan: dict) -> None:
        self.plan = plan
        self._update_system_prompt()

    def _update_system_prompt(self) -> None:
        text = engine.system_prompt(
            self.session,
            self.plan,
            engine.continuity_text(self.continuity_state),
            skills=self._skills_text,
            memories=engine.memories_text(self.memories),
        )
        if text == self._system_text:
            return
        self._system_text = text
        self.history.set_system(text)
        self.system_blob_id = engine.prompt_blob(self.session.tenant_id, "system_prompt", text)
        self.system_tokens = estimate_message_tokens({"content": text})

    def request(self) -> engine.AssembledRequest:
        history = self.history
        local_estimate = self.system_tokens + history.history_tokens + self.tools_tokens
        return engine.AssembledRequest(
            messages=history.messages,
            tools=self.tool_schemas,
            model=self.model,
            system_prompt_blob_id=self.system_blob_id,
            tool_schemas_blob_id=self.tool_schemas_blob_id,
            first_message_id=history.first_id,
            last_message_id=history.last_id,
            message_count=history.count,
            messages_digest=history.digest,
            fact_versions={
                "config_version": self.writer.config_version,
                "tenant_config_version": self.writer.tenant_config_version,
                "plan_version": (self.plan or {}).get("version", 0),
                "context_start_message_id": history.context_start_id,
                "checkpoint_id": self.checkpoint_id,
                "anchor_message_id": history.anchor_id,
                "local_estimate": local_estimate,
                "budget": self.budget,
                "skills": {skill.name: skill.version for skill in self.loaded_skills},
                "memory_ids": [m.pk for m in self.memories],
            },
            # What the budget is checked against: the provider's last report plus our estimate
            # of what was added since (llm/tokens.py).
            estimated_tokens=self.calibration.count(local_estimate, history.context_start_id),
        )

    def calibrate(self, request: engine.AssembledRequest, usage: dict) -> None:
        """The provider reported what `request` really cost: later counts start from that."""
        reported = int(usage.get("prompt_tokens") or 0)
        if reported > 0:
            self.calibration = Calibration(
                reported=reported,
                estimated=request.fact_versions["local_estimate"],
                context_start_id=request.fact_versions["context_start_message_id"],
            )

    @property
    def fixed_tokens(self) -> int:
        """What a request holds besides the history from the context start."""
        return self.system_tokens + self.tools_tokens + self.history.anchor_tokens

    def approval_verdict(self, tool, args: dict, ctx):
        """ToolService's approval stage, on the rules the slice loaded."""
        return approvals.verdict_for(ctx.tenant_id, tool, args, rules=self.policy_rules)


# Contexts kept between slices: one per Session a worker process may be driving.
MAX_KEPT_CONTEXTS = max(64, settings.XAGENT_WORKER_SESSIONS, settings.XAGENT_EMBEDDED_WORKER_THREADS)
_kept_contexts: OrderedDict[str, SliceContext] = OrderedDict()
_kept_lock = threading.Lock()


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
    compacted: bool = False  # the step compacted the context instead of calling the model
    detail: str = ""


def _signature(name: str, arguments: str) -> str:
    try:
        canonical = json.dumps(json.loads(arguments), sort_keys=True)
    except (ValueError, TypeError, RecursionError):
        canonical = arguments
    return hashlib.sha256(f"{name}\x00{canonical}".encode()).hexdigest()[:16]


class AgentService:
    def __init__(self, session_id, token, heartbeat=None):
        self.session_id, self.token, self.heartbeat = session_id, token, heartbeat
        self.context = SliceContext.for_slice(session_id, token)
        self.cancel = CancelSignal()
        self._watcher: watch.Watched | None = None
        self.tool_service = ToolService(approval_hook=self.context.approval_verdict)

    # --- the slice's life -----------------------------------------------------------------------

    @property
    def current(self) -> bool:
        """True while the slice's context may be used without re-reading (see SliceContext)."""
        return self.context.current

    def prepare(self, turn_id: int) -> None:
        """At a step boundary: (re-)read what changed, for the turn `turn_id`."""
        self.context.refresh(turn_id)
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
        """Until the slice pauses: an interrupt sets `cancel`, and the lease is kept alive."""
        self._watch()

    def _watch(self) -> None:
        if self._watcher is None:
            self._watcher = watch.watch(
                self.session_id, self.token, self.cancel, beats=self.heartbeat is not None
            )

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
                outcome = self.tool_service.execute(
                    approval.call_id,
                    spec["name"],
                    json.dumps(approval.arguments),
                    context.tool_context,
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
        self._watch()
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
        engine.finish_turn(
            self.session_id, self.token, context.turn_id, reason, detail, progress=context.progress
        )
        context.progress_saved = copy.deepcopy(context.progress)
        self.invalidate()
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


def _failed_call(exc: Exception) -> ModelResult:
    """The evidence of a call that never answered: its attempts and their errors."""
    return ModelResult(
        finish_reason="error",
        attempts=getattr(exc, "attempts", 1),
        attempt_errors=list(getattr(exc, "attempt_errors", [])),
    )


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
