"""Session facts. SessionEngine (runtime/engine/) and Brain (runtime/brain.py) are the
only writers; edges read through `for_tenant` and call their operations."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from tenancy_app.models import TenantOwnedModel
from tools_app.models import OperatorConfigured

from .choices import (
    CallPurpose,
    GoalDecision,
    GoalRunStatus,
    InputKind,
    InputRequestAction,
    InputRequestStatus,
    InputStatus,
    MemoryKind,
    PlanTaskStatus,
    QuotaPeriod,
    Role,
    SessionKind,
    SessionStatus,
    TurnReason,
)


class ModelConfig(OperatorConfigured, TenantOwnedModel):
    """An OpenAI-compatible endpoint a tenant's Sessions may use.

    Without any row, Sessions use the environment default (OPENAI_*), and without an
    API key there, the scripted demo model. A base URL a tenant admin set passes the outbound
    guard (`tools_app.net`) at every connect; one an operator set does not.
    """

    OPERATOR_FIELDS = ("base_url",)

    name = models.CharField(max_length=100)
    base_url = models.URLField(
        "base URL", max_length=500, blank=True, help_text="e.g. https://api.openai.com/v1"
    )
    api_key_encrypted = models.TextField(blank=True, editable=False)
    model = models.CharField(max_length=200)
    context_window = models.PositiveIntegerField(default=128000)
    max_output_tokens = models.PositiveIntegerField(default=4096)
    temperature = models.FloatField(null=True, blank=True)
    is_default = models.BooleanField(default=False)
    # Prices per million tokens, in the deployment's currency (XAGENT_USAGE_CURRENCY). A call is
    # priced when it is recorded, with the prices its slice read: a change applies from the next
    # call on. Without an input and an output price calls are counted, not priced.
    input_price = models.DecimalField(
        "input price",
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        help_text="per million prompt tokens",
    )
    cached_input_price = models.DecimalField(
        "cached input price",
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        help_text="per million prompt tokens the provider served from its cache (blank: the input price)",
    )
    output_price = models.DecimalField(
        "output price",
        max_digits=12,
        decimal_places=6,
        null=True,
        blank=True,
        help_text="per million completion tokens",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="unique_model_config_name"),
            models.UniqueConstraint(
                fields=["tenant"], condition=models.Q(is_default=True), name="one_default_model_config"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.model})"


class Session(TenantOwnedModel):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="agent_sessions"
    )
    kind = models.CharField(max_length=10, choices=SessionKind.choices, default=SessionKind.MAIN)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    title = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=20, choices=SessionStatus.choices, default=SessionStatus.IDLE)
    status_reason = models.CharField(max_length=500, blank=True)
    session_goal = models.TextField(blank=True)
    phase_goal = models.TextField(blank=True)
    model_config = models.ForeignKey(
        ModelConfig, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Bumped by every change of what a request is assembled from (model, skills, tools), and
    # recorded in each ModelCall, so evidence tells which configuration a request saw.
    config_version = models.PositiveIntegerField(default=1)
    # The first message the model still sees; earlier ones are summarized by a checkpoint.
    context_start_message = models.ForeignKey(
        "Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The committed compaction whose continuity state stands in for the messages before
    # `context_start_message` (None: nothing was compacted yet).
    context_checkpoint = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    current_turn = models.ForeignKey(
        "Turn", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Single runner (ARCHITECTURE §3): who holds the lease, until when, and whether work arrived meanwhile.
    runner_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The process that claimed the lease ("host:pid:nonce", see runtime/presence.py), so a sweep
    # can tell a lost runner from a slow one without waiting for the lease to lapse.
    runner_holder = models.CharField(max_length=200, blank=True, default="")
    wake_requested = models.BooleanField(default=False)
    last_event_seq = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    archived_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "-created_at"]),
            models.Index(fields=["lease_expires_at"]),
        ]

    def __str__(self) -> str:
        return self.title or str(self.id)


class Input(TenantOwnedModel):
    """The Session's input queue. Every input is committed here before anything can fail."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="inputs")
    kind = models.CharField(max_length=20, choices=InputKind.choices)
    payload = models.JSONField(default=dict)
    # NULL, not "", for "no key": the unique constraint must not treat keyless inputs as duplicates.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # The caller whose Idempotency-Key namespace it was sent in: `key:<id>` for a call made with an
    # API key, else `user:<id>` (as the rate limits name a caller). A key string is that caller's
    # own: a colleague reusing it sends their own input and never receives someone else's.
    caller = models.CharField(max_length=50, blank=True, default="")
    status = models.CharField(max_length=10, choices=InputStatus.choices, default=InputStatus.QUEUED)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    consumed_at = models.DateTimeField(null=True, blank=True)
    turn = models.ForeignKey("Turn", null=True, blank=True, on_delete=models.SET_NULL, related_name="inputs")

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["session", "caller", "idempotency_key"],
                name="unique_input_idempotency_key_per_caller",
            )
        ]
        indexes = [
            models.Index(fields=["session", "status", "id"]),
            # The recovery sweep's "which Sessions have queued work" stays a small index scan
            # however many consumed inputs accumulate.
            models.Index(
                fields=["session"], condition=models.Q(status=InputStatus.QUEUED), name="input_queued_idx"
            ),
        ]


class Turn(TenantOwnedModel):
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="turns")
    number = models.PositiveIntegerField()
    reason = models.CharField(max_length=20, choices=TurnReason.choices, blank=True)
    reason_detail = models.CharField(max_length=1000, blank=True)
    steps = models.PositiveIntegerField(default=0)
    # Loop-guard memory across steps and slices: {"failure_signature", "repeats", "idle_rounds"}.
    guard_state = models.JSONField(default=dict, blank=True)
    # Memories recalled for this turn at task setup (ids; a memory deleted since drops out).
    recalled_memory_ids = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # The turn ended and what that moves above the SessionEngine (a delegating MainSession's
    # report, a goal run's next round) is still to be applied by Brain (runtime/followups.py).
    # Committed with the turn's end, so a runner lost in between leaves it to the next one.
    followups_pending = models.BooleanField(default=False)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["session", "number"], name="unique_turn_number")]
        indexes = [
            models.Index(
                fields=["session"], condition=models.Q(followups_pending=True), name="turn_followups_idx"
            )
        ]

    def __str__(self) -> str:
        return f"turn {self.number} ({self.reason or 'open'})"


class Message(TenantOwnedModel):
    """Append-only history. Raw history is never deleted, compression only moves the window."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="messages")
    turn = models.ForeignKey(Turn, null=True, blank=True, on_delete=models.SET_NULL, related_name="messages")
    role = models.CharField(max_length=10, choices=Role.choices)
    content = models.TextField(blank=True)
    # [{"id", "name", "arguments"}]: arguments kept as the model sent them (a JSON string).
    tool_calls = models.JSONField(default=list, blank=True)
    tool_call_id = models.CharField(max_length=200, blank=True)
    tool_name = models.CharField(max_length=200, blank=True)
    is_error = models.BooleanField(default=False)
    input = models.ForeignKey(Input, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # The local token estimate of this message on the wire, made once when it was committed:
    # a request's estimate is a sum, not a re-count of history (llm/tokens.py).
    token_estimate = models.PositiveIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["session", "id"])]

    def __str__(self) -> str:
        return f"#{self.pk} {self.role}" + (f" ({self.tool_name})" if self.tool_name else "")


class PromptBlob(TenantOwnedModel):
    """System prompts and tool schemas stored once by content hash and referenced by evidence."""

    digest = models.CharField(max_length=64)
    kind = models.CharField(max_length=20)
    content = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "digest"], name="unique_prompt_blob")]


class ModelCall(TenantOwnedModel):
    """Request evidence for one model call: a read-only projection, never a source of truth."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="model_calls")
    turn = models.ForeignKey(
        Turn, null=True, blank=True, on_delete=models.SET_NULL, related_name="model_calls"
    )
    purpose = models.CharField(max_length=20, choices=CallPurpose.choices, default=CallPurpose.AGENT)
    provider = models.CharField(max_length=20)
    model = models.CharField(max_length=200)
    base_url = models.CharField(max_length=500, blank=True)
    params = models.JSONField(default=dict)
    system_prompt = models.ForeignKey(PromptBlob, null=True, on_delete=models.PROTECT, related_name="+")
    tool_schemas = models.ForeignKey(PromptBlob, null=True, on_delete=models.PROTECT, related_name="+")
    first_message_id = models.BigIntegerField(null=True)
    last_message_id = models.BigIntegerField(null=True)
    message_count = models.PositiveIntegerField(default=0)
    messages_digest = models.CharField(max_length=64, blank=True)
    fact_versions = models.JSONField(default=dict)
    estimated_prompt_tokens = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveIntegerField(default=0)
    # Of `prompt_tokens`, those the provider served from its prompt cache (as it reported them).
    cached_prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    # What the call cost at the prices of its model when it was recorded (`params["prices"]`);
    # null: the model has no prices.
    cost = models.DecimalField(max_digits=18, decimal_places=8, null=True, blank=True)
    finish_reason = models.CharField(max_length=30, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    attempt_errors = models.JSONField(default=list)
    error = models.TextField(blank=True)
    latency_ms = models.PositiveIntegerField(null=True)
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            # Usage totals read a tenant's calls of a period (sessions_app/usage.py).
            models.Index(fields=["tenant", "started_at"], name="modelcall_tenant_started"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.purpose} ({self.model})"


class SessionEvent(TenantOwnedModel):
    """Append-only event log with a per-Session gap-free `seq`: the truth clients catch up from."""

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveBigIntegerField()
    type = models.CharField(max_length=50)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # `session_id`, not `session`: ordering by the relation takes the Session's own ordering,
        # so every event query without an order_by joined the sessions table to sort by it.
        ordering = ["session_id", "seq"]
        constraints = [models.UniqueConstraint(fields=["session", "seq"], name="unique_event_seq")]

    def as_dict(self) -> dict:
        return {"seq": self.seq, "type": self.type, "ts": self.created_at.isoformat(), "data": self.data}


class Plan(TenantOwnedModel):
    session = models.OneToOneField(Session, on_delete=models.CASCADE, related_name="plan")
    title = models.CharField(max_length=300)
    version = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField(auto_now=True)

    def as_dict(self) -> dict:
        return {
            "title": self.title,
            "tasks": [
                {"id": t.task_id, "title": t.title, "status": t.status}
                for t in self.tasks.order_by("position")
            ],
        }


class PlanTask(TenantOwnedModel):
    plan = models.ForeignKey(Plan, on_delete=models.CASCADE, related_name="tasks")
    task_id = models.CharField(max_length=50)
    position = models.PositiveIntegerField()
    title = models.CharField(max_length=500)
    status = models.CharField(max_length=20, choices=PlanTaskStatus.choices, default=PlanTaskStatus.PENDING)

    class Meta:
        ordering = ["position"]
        constraints = [models.UniqueConstraint(fields=["plan", "task_id"], name="unique_plan_task_id")]


class WorkerPresence(models.Model):
    """A process that runs runner slices, kept fresh by its presence thread (runtime/presence.py).

    Infrastructure, not tenant data: a Session's `runner_holder` names one of these, and a holder
    whose row is missing or stale (or whose process is gone on this host) has lost its leases.
    """

    holder = models.CharField(max_length=200, unique=True)
    host = models.CharField(max_length=150)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    seen_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["host", "pid"]
        verbose_name_plural = "worker presence"

    def __str__(self) -> str:
        return self.holder


class RunnerSlice(TenantOwnedModel):
    """Audit of every runner slice: who held the lease when, and what it consumed.

    Lets tests and operators prove the single-runner rule (no two slices of one Session overlap).
    """

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="runner_slices")
    token = models.UUIDField()
    worker = models.CharField(max_length=200, blank=True)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True)
    steps = models.PositiveIntegerField(default=0)
    inputs_consumed = models.PositiveIntegerField(default=0)
    outcome = models.CharField(max_length=50, blank=True)

    class Meta:
        ordering = ["id"]


class SessionCapability(TenantOwnedModel):
    """A Skill, ToolSet or Tool attached to a Session: add-only, with who added it and when."""

    class Kind(models.TextChoices):
        TOOL = "tool", "Tool"
        TOOLSET = "toolset", "Tool set"
        SKILL = "skill", "Skill"

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="capabilities")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    name = models.CharField(max_length=100)
    added_by = models.CharField(
        max_length=50, help_text="model (tools_select), default, orchestrator, or a username"
    )
    added_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "session capabilities"
        constraints = [
            models.UniqueConstraint(fields=["session", "kind", "name"], name="unique_session_capability")
        ]


class Checkpoint(TenantOwnedModel):
    """One context compaction (ARCHITECTURE §5): the continuity state that stands in for the
    messages before `start_message` in every later request. Raw history is never deleted.

    Written `pending` before the summary call (with the boundary it chose), given its validated
    summary, then `committed` together with the Session's new context start — or `discarded`
    (interrupted, or the runner was lost before its summary was validated). When the summary
    fails or is invalid it commits as a `trim`, the deterministic fallback: the same boundary, a
    continuity state built from facts the product holds, `reason` saying why.
    """

    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        COMMITTED = "committed", "Committed"
        DISCARDED = "discarded", "Discarded"

    class Method(models.TextChoices):
        SUMMARY = "summary", "Summary"
        TRIM = "trim", "Deterministic trim"

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="checkpoints")
    turn = models.ForeignKey(Turn, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    method = models.CharField(max_length=10, choices=Method.choices, default=Method.SUMMARY)
    # The first message still sent after this compaction (a legal boundary: never a tool result
    # whose call would be cut off), and the last message the continuity state covers.
    start_message = models.ForeignKey(Message, on_delete=models.PROTECT, related_name="+")
    covers_from_id = models.BigIntegerField(null=True)
    covers_to_id = models.BigIntegerField()
    # The active turn's user request, sent after the continuity state when it lies before the
    # boundary (the anchor the turn continues from).
    anchor_message = models.ForeignKey(
        Message, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # {"goal", "deliverables", "progress", "decisions", "constraints", "open_questions",
    #  "next_actions", "artifacts", "active_user_request"}: validated before it is stored.
    state = models.JSONField(default=dict, blank=True)
    summary_call = models.ForeignKey(
        ModelCall, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    tokens_before = models.PositiveIntegerField(default=0)
    tokens_after = models.PositiveIntegerField(default=0)
    budget = models.PositiveIntegerField(default=0)
    reason = models.CharField(max_length=500, blank=True, help_text="why it was discarded or trimmed")
    created_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["session"], condition=models.Q(status="pending"), name="one_pending_checkpoint"
            )
        ]

    @property
    def validated(self) -> bool:
        return bool(self.state)


class Delivery(TenantOwnedModel):
    """What a completed turn delivered, checked by the product, not by the model.

    Written by SessionEngine in the same transaction that ends the turn `completed`
    (`engine.finish_turn`). `checks` come from real parsers run on each file
    (`sessions_app.artifacts`); `unresolved_failures` are the turn's failed tool calls that no
    later successful call of the same tool on the same target made good. A model saying
    "validated" is never evidence; these rows are.
    """

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="deliveries")
    turn = models.OneToOneField(Turn, on_delete=models.CASCADE, related_name="delivery")
    final_answer = models.TextField(blank=True)
    # [{"path", "size", "sha256"}]
    files = models.JSONField(default=list)
    # [{"path", "check", "ok", "detail", "facts"}]
    checks = models.JSONField(default=list)
    # [{"call_id", "tool", "summary"}]
    unresolved_failures = models.JSONField(default=list)
    # Calls that did not run because a person rejected them (or let them expire) or a rule denied
    # them: decisions, not failures. [{"call_id", "tool", "decision", "by", "comment"}]
    decisions = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        verbose_name_plural = "deliveries"

    @property
    def checks_ok(self) -> bool:
        return all(check.get("ok") for check in self.checks)

    @property
    def outcome(self) -> str:
        """`failed` (a failed check or an unresolved failure), `nothing_delivered` (no file, no
        check: whatever the answer says, nothing was there to check) or `delivered`."""
        if self.unresolved_failures or not self.checks_ok:
            return "failed"
        if not self.files and not self.checks:
            return "nothing_delivered"
        return "delivered"


class Quota(TenantOwnedModel):
    """A limit on what a tenant's model calls may use per period, in tokens (prompt + completion),
    in cost (in XAGENT_USAGE_CURRENCY, at the prices recorded with the calls), or both.

    Without a user it applies to the whole tenant; with one, to that member's Sessions. It is
    checked before every model call (sessions_app/quotas.py): over it, the Session parks as
    `queued` with reason `quota_exceeded` and resumes on its own when the limit is raised or a
    new period begins. Calls already under way finish: a race of Sessions against the last of a
    quota overshoots it by at most one model call each.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        help_text="blank: the whole tenant",
    )
    period = models.CharField(max_length=10, choices=QuotaPeriod.choices, default=QuotaPeriod.MONTH)
    max_tokens = models.PositiveBigIntegerField(
        "token limit", null=True, blank=True, help_text="prompt + completion tokens per period"
    )
    max_cost = models.DecimalField(
        "cost limit", max_digits=14, decimal_places=4, null=True, blank=True, help_text="per period"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["tenant", "user", "period"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "period"],
                condition=models.Q(user__isnull=True),
                name="one_tenant_quota_per_period",
            ),
            models.UniqueConstraint(
                fields=["tenant", "user", "period"],
                condition=models.Q(user__isnull=False),
                name="one_user_quota_per_period",
            ),
            models.CheckConstraint(
                condition=models.Q(max_tokens__isnull=False) | models.Q(max_cost__isnull=False),
                name="quota_has_a_limit",
            ),
        ]

    def __str__(self) -> str:
        whose = self.user.get_username() if self.user_id else "whole tenant"
        return f"{whose}: {self.limit_text} per {self.period}"

    @property
    def limit_text(self) -> str:
        parts = []
        if self.max_tokens is not None:
            parts.append(f"{self.max_tokens:,} tokens")
        if self.max_cost is not None:
            parts.append(f"{self.max_cost} {settings.XAGENT_USAGE_CURRENCY}")
        return " or ".join(parts)


class Memory(TenantOwnedModel):
    """A long-term memory of one user in one tenant (never shared across users or tenants):
    written by the `memory_save` tool, recalled at task setup of the user's later Sessions,
    listed and deleted by the user (`/api/v1/memories/`)."""

    MAX_TEXT = 2000

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memories")
    kind = models.CharField(max_length=12, choices=MemoryKind.choices)
    text = models.TextField(max_length=MAX_TEXT)
    source_session = models.ForeignKey(
        Session, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        verbose_name_plural = "memories"
        indexes = [models.Index(fields=["tenant", "user", "-updated_at"])]

    def __str__(self) -> str:
        return f"{self.kind}: {self.text[:60]}"


class GoalRun(TenantOwnedModel):
    """A long task run as several rounds (`runtime/goal_driver.py` is its only writer).

    Each round is an ordinary message input of the Session. After a round's turn ends the driver
    reads the product's own facts — the turn's end reason, the Session's token counters, the
    clock, the turn's delivery record and the plan — and decides continue / done / stop, recorded
    here and as a `goal.decided` event. Any recovery of a lost runner pauses an active run; only a
    person resumes it. At most one run per Session is open (active or paused) at a time.
    """

    MAX_ROUNDS = 50
    OPEN_STATUSES = (GoalRunStatus.ACTIVE, GoalRunStatus.PAUSED)

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="goal_runs")
    goal = models.TextField(max_length=10000)
    max_rounds = models.PositiveSmallIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_ROUNDS)]
    )
    # Prompt + completion tokens the Session may spend while the run is open (all its model calls).
    token_budget = models.PositiveBigIntegerField(validators=[MinValueValidator(1)])
    wall_clock_seconds = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    status = models.CharField(max_length=10, choices=GoalRunStatus.choices, default=GoalRunStatus.ACTIVE)
    rounds_done = models.PositiveSmallIntegerField(default=0, help_text="rounds whose turn has ended")
    # The Session's prompt + completion counters when the run started; what it used is the
    # difference, frozen at each decision in `tokens_used`.
    tokens_at_start = models.PositiveBigIntegerField(default=0)
    tokens_used = models.PositiveBigIntegerField(default=0)
    # The input of the latest round the driver queued, and the turn of the latest round that ended.
    round_input = models.ForeignKey(Input, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    last_turn = models.ForeignKey(Turn, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    last_decision = models.CharField(max_length=10, choices=GoalDecision.choices, blank=True)
    last_reason = models.CharField(max_length=1000, blank=True)
    last_decision_round = models.PositiveSmallIntegerField(null=True, blank=True)
    paused_reason = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["session"],
                condition=models.Q(status__in=["active", "paused"]),
                name="one_open_goal_run",
            ),
            models.CheckConstraint(
                condition=models.Q(max_rounds__gte=1, max_rounds__lte=50), name="goal_run_max_rounds_range"
            ),
            models.CheckConstraint(condition=models.Q(token_budget__gte=1), name="goal_run_token_budget_min"),
            models.CheckConstraint(
                condition=models.Q(wall_clock_seconds__gte=1), name="goal_run_wall_clock_min"
            ),
        ]

    def __str__(self) -> str:
        return f"goal run #{self.pk} ({self.status})"

    @property
    def is_open(self) -> bool:
        return self.status in self.OPEN_STATUSES


class InputRequest(TenantOwnedModel):
    """An MCP server's `elicitation/create` during a running tool call: a question for a person.

    SessionEngine owns it (`runtime/engine/elicitation.py`): the tool's handler creates it and
    waits; a person answers (browser, API, WebSocket), the wait times out (`expired`, the server
    is told `decline`) or an interrupt cancels it. The answer fields are its audit record, like a
    PendingApproval's decision fields.
    """

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="input_requests")
    turn = models.ForeignKey("Turn", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    call_id = models.CharField(max_length=200, help_text="the tool call during which the server asked")
    server = models.CharField(max_length=200, help_text="the MCP server's name")
    tool = models.CharField(max_length=200, help_text="the tool the model called")
    message = models.TextField(help_text="the server's question, as it sent it")
    schema = models.JSONField(default=dict, help_text="the requested schema (flat object of primitives)")
    status = models.CharField(
        max_length=10, choices=InputRequestStatus.choices, default=InputRequestStatus.PENDING
    )
    action = models.CharField(max_length=10, choices=InputRequestAction.choices, blank=True)
    content = models.JSONField(null=True, blank=True, help_text="the accepted answer, as sent to the server")
    requested_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    answered_at = models.DateTimeField(null=True, blank=True)
    answered_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="empty when nobody answered (expired, or cancelled by an interrupt)",
    )

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["session", "status"])]

    def __str__(self) -> str:
        return f"input request #{self.pk} from {self.server} ({self.status})"
