"""SliceContext: what a runner slice reads once and reuses step after step, and the process-wide
cache that hands it to the Session's next slice in this process (history is append-only and
configuration carries its versions, so a kept context only needs catching up).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict

from django.conf import settings

from approvals_app import policy as approval_policy
from skills_app import catalog as skills_catalog
from tools_app.base import ToolContext
from tools_app.catalog import resolve_available, sandbox_limits_for, tenant_tool_names
from tools_app.registry import DELEGATE_TOOL, GOAL_TOOL
from tools_app.secrets import Redactor, bound_shell_environment, tenant_secret_values

from .. import quotas
from ..choices import CallPurpose, SessionKind
from ..models import Checkpoint, ModelCall, Plan, Session, Turn
from . import approvals, engine, memory
from .llm.config import EffectiveModel, resolve_model
from .llm.tokens import (
    Calibration,
    context_budget,
    estimate_message_tokens,
    estimate_tools_tokens,
)
from .session_port import RuntimeSessionPort

logger = logging.getLogger(__name__)


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
        self.turn: Turn | None = None  # the turn as read when it became the slice's (for its delivery)
        self.goal_round: dict | None = None  # {"goal_run_id", "round"} while the turn is a round
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
        self.quota_rules: tuple = ()

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

    def quota_spent(self) -> quotas.Exceeded | None:
        """A quota of this Session's owner or tenant that is spent now (one query), or None."""
        if not self.quota_rules:
            return None
        return quotas.spent(self.session.tenant_id, self.session.owner_id, self.quota_rules)

    @property
    def current(self) -> bool:
        return self.writer is not None and self.writer.current and self.turn_id is not None

    def refresh(self, turn_id: int, started: Turn | None = None) -> None:
        """`started`: the turn as `engine.start_turn` returned it, when it has just begun; what
        it carries (its input, no steps yet) is not read back."""
        started = started if started is not None and started.pk == turn_id else None
        session = Session.objects.select_related("model_config", "tenant").get(pk=self.session_id)
        tenant_version = session.tenant.config_version
        if self.writer is None:
            self.writer = engine.RunnerWriter(self.session_id, self.token, session.tenant_id)
            self.turn_id = None  # a new slice re-reads the turn's progress
        self.session = session
        if turn_id != self.turn_id:
            # A goal run's round gets `update_goal` (its claim); any other turn does not.
            self.goal_round = (
                engine.goal_round_in(started.started_by.payload)
                if started is not None
                else engine.goal_round_of(turn_id)
            )
        key = (session.config_version, tenant_version, session.model_config_id, self.goal_round is not None)
        if key != self._configuration_key:
            self._read_configuration(session, tenant_version)
            self._configuration_key = key
        if turn_id != self.turn_id or not self.writer.current:
            turn = started or Turn.objects.only(
                "tenant_id", "session_id", "steps", "guard_state", "recalled_memory_ids", "started_at"
            ).get(pk=turn_id)
            authors = {started.started_by.created_by_id} if started else engine.turn_author_ids(turn_id)
            self.turn_id, self.turn = turn_id, turn
            self.progress = engine.TurnProgress(turn.steps, dict(turn.guard_state))
            self.progress_saved = engine.TurnProgress(turn.steps, dict(turn.guard_state))
            self.memory_user_id = engine.memory_user_id(session, authors)
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

    def _read_configuration(self, session: Session, tenant_version: int) -> None:
        """Read the Session's configuration. What depends only on the tenant's configuration
        (its version changes with every model, tool, tool set, MCP server, secret, skill or policy
        saved) is shared by the tenant's Sessions in this process (`shared_configuration`): a
        burst of new Sessions of one tenant reads it once, not once each."""
        tenant_id = session.tenant_id
        version = (tenant_id, tenant_version)
        model = shared_configuration(
            ("model", *version, session.model_config_id), lambda: resolve_model(session)
        )
        if self.model is None or (model.base_url, model.model) != (self.model.base_url, self.model.model):
            self.calibration = None  # another model counts differently
        self.model = model
        self.budget = context_budget(self.model.context_window, self.model.max_output_tokens)
        capabilities = engine.session_capabilities(session.pk)
        # A MainSession coordinates: it may hand tasks to sub-Sessions (which may not).
        coordinator = session.kind == SessionKind.MAIN
        goal_round = self.goal_round is not None
        chosen_tools, chosen_sets = tuple(capabilities["tools"]), tuple(capabilities["toolsets"])
        bound = [*([DELEGATE_TOOL] if coordinator else []), *([GOAL_TOOL] if goal_round else [])]

        def tools():
            available = resolve_available(tenant_id, [*chosen_tools, *bound], list(chosen_sets))
            # Not even through a tool set an admin put them in: only a MainSession delegates, and
            # only a goal run's round says where its goal stands.
            for name in {DELEGATE_TOOL, GOAL_TOOL} - set(bound):
                available.pop(name, None)
            schemas = [tool.openai_schema() for tool in available.values()]
            blob_id = engine.prompt_blob(tenant_id, "tool_schemas", json.dumps(schemas, sort_keys=True))
            return available, schemas, blob_id, estimate_tools_tokens(schemas)

        available, self.tool_schemas, self.tool_schemas_blob_id, self.tools_tokens = shared_configuration(
            ("tools", *version, chosen_tools, chosen_sets, coordinator, goal_round), tools
        )
        self.tools = dict(available)  # the Session's own copy of the mapping

        def skills():
            loaded = skills_catalog.loaded(tenant_id, capabilities["skills"])
            names = [skill.name for skill in loaded]
            offered, more = skills_catalog.offered(tenant_id, exclude=names)
            return loaded, names, engine.skills_text(offered, more, loaded)

        self.loaded_skills, names, self._skills_text = shared_configuration(
            ("skills", *version, tuple(capabilities["skills"])), skills
        )
        self.loaded_skill_names = list(names)

        def tenant():
            secrets = tenant_secret_values(tenant_id)
            # Every value of the tenant, bound in this Session or not: a model may echo any it saw.
            return (
                tenant_tool_names(tenant_id),
                secrets,
                Redactor(secrets.values()),
                approval_policy.tenant_rules(tenant_id),
                quotas.rules(tenant_id),
            )

        self.known_tools, secrets, self.redactor, self.policy_rules, tenant_quotas = shared_configuration(
            ("tenant", *version), tenant
        )
        # Only the quotas that apply to this Session's owner: most tenants have none, and then a
        # step checks nothing (no query).
        self.quota_rules = tuple(q for q in tenant_quotas if q.user_id in (None, session.owner_id))
        shell = "shell_exec" in self.tools
        # Only what admins wrote (the tool sets' shell environments) carries a secret into a
        # process, never the model's arguments (ARCHITECTURE §7).
        bound, limits = (
            shared_configuration(
                ("shell", *version, chosen_sets),
                lambda: (
                    bound_shell_environment(tenant_id, list(chosen_sets), secrets),
                    sandbox_limits_for(tenant_id),
                ),
            )
            if shell
            else (None, None)
        )
        self.tool_context = ToolContext(
            session_id=str(self.session_id),
            tenant_id=tenant_id,
            workspace=engine.workspace_path(session),
            port=RuntimeSessionPort(self),
            env=dict(bound.env) if bound else {},
            env_problem=bound.problem if bound else "",
            sandbox_limits=limits,
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
# What Sessions of one tenant share of their configuration, keyed by (kind, tenant id, the
# tenant's configuration version, ...): a saved change makes a new version, so an entry is never
# stale, only unused (and evicted, least recently used first).
MAX_SHARED_CONFIGURATIONS = 512
_shared: OrderedDict[tuple, object] = OrderedDict()
_shared_lock = threading.Lock()


def shared_configuration(key: tuple, build):
    """The value for `key`, built once per process (two threads may both build it at first)."""
    with _shared_lock:
        if key in _shared:
            _shared.move_to_end(key)
            return _shared[key]
    value = build()
    with _shared_lock:
        _shared[key] = value
        while len(_shared) > MAX_SHARED_CONFIGURATIONS:
            _shared.popitem(last=False)
    return value


MAX_KEPT_CONTEXTS = max(64, settings.XAGENT_WORKER_SESSIONS, settings.XAGENT_EMBEDDED_WORKER_THREADS)
_kept_contexts: OrderedDict[str, SliceContext] = OrderedDict()
_kept_lock = threading.Lock()
