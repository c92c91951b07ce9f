import json

from drf_spectacular.utils import extend_schema_field, inline_serializer
from rest_framework import serializers

from approvals_app.actions import DECISIONS
from approvals_app.choices import ApprovalStatus
from config.api import ParameterError
from tools_app.base import ToolError
from tools_app.workspace import relative_posix, resolve_in_workspace

from ..choices import (
    GoalDecision,
    InputKind,
    InputRequestAction,
    InputRequestStatus,
    InputStatus,
    PlanTaskStatus,
    QueueReason,
    SessionKind,
)
from ..models import (
    Delivery,
    GoalRun,
    Input,
    Message,
    ModelCall,
    ModelConfig,
    Session,
    SessionCapability,
    SessionEvent,
)
from ..runtime import approvals, goal_driver
from ..runtime.llm.config import resolve_model, tenant_default_config

IDEMPOTENCY_KEY_MAX_LENGTH = Input._meta.get_field("idempotency_key").max_length


class StringField(serializers.CharField):
    """Text that must arrive as a string: DRF's CharField would take 123 as "123" and 1e400 as
    "inf", which no client meant."""

    default_error_messages = {"not_a_string": "Must be a string."}

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("not_a_string")
        return super().to_internal_value(data)


class SessionSerializer(serializers.ModelSerializer):
    goal = serializers.CharField(write_only=True, required=False, allow_blank=True, max_length=10000)
    model = serializers.CharField(
        write_only=True,
        required=False,
        allow_blank=True,
        help_text="name of one of the tenant's model configurations",
    )
    parent = serializers.PrimaryKeyRelatedField(
        queryset=Session.objects.none(), required=False, allow_null=True
    )
    capabilities = serializers.SerializerMethodField()
    usage = serializers.SerializerMethodField()
    model_label = serializers.SerializerMethodField()

    class Meta:
        model = Session
        fields = [
            "id",
            "title",
            "kind",
            "parent",
            "status",
            "status_reason",
            "session_goal",
            "phase_goal",
            "created_at",
            "updated_at",
            "archived_at",
            "capabilities",
            "usage",
            "model_label",
            "goal",
            "model",
        ]
        read_only_fields = [
            "id",
            "status",
            "status_reason",
            "session_goal",
            "phase_goal",
            "created_at",
            "updated_at",
            "archived_at",
        ]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        tenant = getattr(request, "tenant", None)
        if tenant is not None:
            # A parent can only be one of this tenant's Sessions: others simply do not exist here.
            self.fields["parent"].queryset = Session.objects.for_tenant(tenant)

    def get_capabilities(self, obj) -> dict:
        from tools_app.registry import DELEGATE_TOOL, default_tool_names

        from ..runtime.engine import session_capabilities

        if "capabilities" in getattr(obj, "_prefetched_objects_cache", {}):
            attached = {"tools": [], "toolsets": [], "skills": []}
            for capability in obj.capabilities.all():
                attached[f"{capability.kind}s"].append(capability.name)
        else:
            attached = session_capabilities(obj.pk)
        coordinator = [DELEGATE_TOOL] if obj.kind == SessionKind.MAIN else []
        tools = list(dict.fromkeys([*default_tool_names(), *coordinator, *attached["tools"]]))
        return {"skills": attached["skills"], "tools": tools, "toolsets": attached["toolsets"]}

    def get_usage(self, obj) -> dict:
        return {"prompt_tokens": obj.prompt_tokens, "completion_tokens": obj.completion_tokens}

    def get_model_label(self, obj) -> str:
        if obj.model_config_id is not None:
            return resolve_model(obj).label
        # One look-up of the tenant's default per serializer (a list page), not one per row.
        cache = self.root.__dict__.setdefault("_tenant_defaults", {})
        if obj.tenant_id not in cache:
            cache[obj.tenant_id] = tenant_default_config(obj.tenant_id)
        return resolve_model(obj, tenant_default=cache[obj.tenant_id]).label

    def validate_kind(self, value):
        if value not in SessionKind.values:
            raise serializers.ValidationError(f"Use one of {', '.join(SessionKind.values)}.")
        return value

    def validate_model(self, value):
        if not value:
            return None
        tenant = self.context["request"].tenant
        config = ModelConfig.objects.for_tenant(tenant).filter(name=value).first()
        if config is None:
            raise serializers.ValidationError(f"No model configuration named {value!r} in this tenant.")
        return config

    def validate(self, attrs):
        parent = attrs.get("parent")
        if attrs.get("kind") == SessionKind.SUB and not parent:
            raise serializers.ValidationError({"parent": "A sub-Session needs its parent Session."})
        if parent is not None and attrs.get("kind", SessionKind.MAIN) != SessionKind.SUB:
            raise serializers.ValidationError({"parent": 'Only a sub-Session (kind "sub") has a parent.'})
        if parent is not None and (parent.kind != SessionKind.MAIN or parent.archived_at is not None):
            raise serializers.ValidationError({"parent": "The parent must be an open MainSession."})
        return attrs


class SessionDetailSerializer(SessionSerializer):
    """One Session (GET/PATCH `/sessions/{id}/`): the list's fields, plus its sub-Sessions and
    where each capability came from (extensions of CONTRACT's shape)."""

    children = serializers.SerializerMethodField()
    capability_sources = serializers.SerializerMethodField()

    class Meta(SessionSerializer.Meta):
        fields = [*SessionSerializer.Meta.fields, "children", "capability_sources"]

    @extend_schema_field(
        inline_serializer(
            "SessionChild",
            {
                "id": serializers.UUIDField(),
                "title": serializers.CharField(),
                "status": serializers.CharField(),
            },
            many=True,
        )
    )
    def get_children(self, obj) -> list[dict]:
        return [
            {"id": str(child["id"]), "title": child["title"], "status": child["status"]}
            for child in Session.objects.filter(
                parent_id=obj.pk, tenant_id=obj.tenant_id, archived_at__isnull=True
            )
            .order_by("created_at")
            .values("id", "title", "status")
        ]

    @extend_schema_field(
        inline_serializer(
            "CapabilitySource",
            {
                "kind": serializers.ChoiceField(choices=SessionCapability.Kind.choices),
                "name": serializers.CharField(),
                "added_by": serializers.CharField(),
                "added_at": serializers.DateTimeField(),
                "servers": serializers.ListField(child=serializers.CharField()),
            },
            many=True,
        )
    )
    def get_capability_sources(self, obj) -> list[dict]:
        from tools_app.catalog import mcp_servers_of

        rows = list(SessionCapability.objects.filter(session_id=obj.pk).order_by("id"))
        servers = mcp_servers_of(
            obj.tenant_id,
            tools=[r.name for r in rows if r.kind == SessionCapability.Kind.TOOL],
            toolsets=[r.name for r in rows if r.kind == SessionCapability.Kind.TOOLSET],
        )
        return [
            {
                "kind": row.kind,
                "name": row.name,
                "added_by": row.added_by,
                "added_at": row.added_at,
                "servers": servers.get((row.kind, row.name), []),
            }
            for row in rows
        ]


class SessionUpdateSerializer(serializers.Serializer):
    title = StringField(max_length=200, allow_blank=True)
    session_goal = StringField(max_length=10000, allow_blank=True)
    phase_goal = StringField(max_length=10000, allow_blank=True)


class InputCreateSerializer(serializers.Serializer):
    """An input, from REST (`POST …/inputs/`) or a WebSocket `input` frame: the same limits.

    DRF's CharField already refuses NUL and lone surrogate characters (PostgreSQL stores neither).
    """

    text = StringField(max_length=100_000, allow_blank=False, trim_whitespace=False)
    kind = serializers.ChoiceField(choices=[InputKind.MESSAGE, InputKind.GUIDANCE], default=InputKind.MESSAGE)
    attachments = serializers.ListField(
        child=serializers.CharField(max_length=1000), required=False, max_length=50
    )

    def validate_text(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("This field may not be blank.", code="blank")
        return value

    def validate_attachments(self, value: list[str]) -> list[str]:
        """Files of the Session's workspace, checked by the rule the file tools use: they must
        exist (an upload comes first), and `..`, absolute paths and symlinks out are refused."""
        workspace = self.context.get("workspace")
        normalized = []
        for path in value:
            if not path.strip():
                raise serializers.ValidationError("An attachment path may not be blank.", code="blank")
            if workspace is None:  # schema generation
                normalized.append(path)
                continue
            try:
                resolved = resolve_in_workspace(workspace, path, must_exist=True)
            except ToolError as exc:
                raise serializers.ValidationError(f"{path[:200]!r}: {exc}", code=exc.code) from None
            if resolved.is_dir():
                raise serializers.ValidationError(f"{path[:200]!r} is a directory.", code="is_a_directory")
            normalized.append(relative_posix(workspace, resolved))
        return list(dict.fromkeys(normalized))


def validated_idempotency_key(request) -> str | None:
    """The `Idempotency-Key` header, or None; too long or holding control characters is a 400 naming it."""
    value = request.headers.get("Idempotency-Key")
    if not value:
        return None
    if len(value) > IDEMPOTENCY_KEY_MAX_LENGTH:
        raise ParameterError(
            "Idempotency-Key", f"must be at most {IDEMPOTENCY_KEY_MAX_LENGTH} characters", where="header"
        )
    if any(ord(char) < 32 or ord(char) == 127 for char in value):
        raise ParameterError("Idempotency-Key", "must not contain control characters", where="header")
    return value


class InputAcceptedSerializer(serializers.Serializer):
    """The answer to `POST …/inputs/` (202, or 200 for a repeated Idempotency-Key) and `…/interrupt/`."""

    input_id = serializers.IntegerField()
    status = serializers.ChoiceField(choices=InputStatus.choices)
    reason = serializers.ChoiceField(
        choices=[QueueReason.QUOTA_EXCEEDED],
        required=False,
        help_text="quota_exceeded: a quota is spent; the input is kept and runs once it is raised or renews",
    )


class GoalRoundSerializer(serializers.Serializer):
    goal_run_id = serializers.IntegerField()
    round = serializers.IntegerField(help_text="1-based; the text names the run's round limit")


class MessageSerializer(serializers.ModelSerializer):
    # Which input a user message came from ("message" or "guidance", null otherwise): guidance is
    # stored as written and framed only for the model, so clients label it from this.
    input_kind = serializers.CharField(source="input.kind", default=None, read_only=True, allow_null=True)
    # Who sent a user message (a Session is the tenant's: colleagues may write in it too).
    author = serializers.CharField(
        source="input.created_by.username", default=None, read_only=True, allow_null=True
    )
    # The MainSession that handed this message's task over (`session_delegate`), else null: its
    # author is the owner, but nobody typed it here.
    delegated_by = serializers.SerializerMethodField()
    # The goal run and round a user message is (the driver queued it for the run's starter, who is
    # its author but did not type it), else null.
    goal_round = serializers.SerializerMethodField()

    class Meta:
        model = Message
        fields = [
            "id",
            "role",
            "input_kind",
            "author",
            "delegated_by",
            "goal_round",
            "content",
            "tool_calls",
            "tool_call_id",
            "tool_name",
            "is_error",
            "turn",
            "created_at",
        ]

    def get_delegated_by(self, obj) -> str | None:
        if obj.input_id is None:
            return None
        delegated = (obj.input.payload or {}).get("delegated_by")
        return str(delegated) if delegated else None

    @extend_schema_field(GoalRoundSerializer(allow_null=True))
    def get_goal_round(self, obj) -> dict | None:
        if obj.input_id is None:
            return None
        payload = obj.input.payload or {}
        if payload.get("goal_run_id") is None:
            return None
        return {"goal_run_id": payload["goal_run_id"], "round": payload.get("round")}


class EventSerializer(serializers.ModelSerializer):
    ts = serializers.DateTimeField(source="created_at")

    class Meta:
        model = SessionEvent
        fields = ["seq", "type", "ts", "data"]


class PlanTaskSerializer(serializers.Serializer):
    id = serializers.CharField()
    title = serializers.CharField()
    status = serializers.ChoiceField(choices=PlanTaskStatus.choices)


class PlanSerializer(serializers.Serializer):
    title = serializers.CharField()
    tasks = PlanTaskSerializer(many=True)


class PlanResponseSerializer(serializers.Serializer):
    """The answer to `GET …/plan/`: `{"plan": {...}}`, or `{"plan": null}` before the agent made one."""

    plan = PlanSerializer(allow_null=True)


class ModelCallSerializer(serializers.ModelSerializer):
    system_prompt_digest = serializers.CharField(source="system_prompt.digest", default="")
    tool_schemas_digest = serializers.CharField(source="tool_schemas.digest", default="")

    class Meta:
        model = ModelCall
        fields = [
            "id",
            "turn",
            "purpose",
            "provider",
            "model",
            "base_url",
            "params",
            "system_prompt_digest",
            "tool_schemas_digest",
            "first_message_id",
            "last_message_id",
            "message_count",
            "messages_digest",
            "fact_versions",
            "estimated_prompt_tokens",
            "prompt_tokens",
            "cached_prompt_tokens",
            "completion_tokens",
            "cost",
            "finish_reason",
            "attempts",
            "attempt_errors",
            "error",
            "latency_ms",
            "started_at",
            "ended_at",
        ]


class ModelCallDetailSerializer(ModelCallSerializer):
    system_prompt = serializers.CharField(source="system_prompt.content", default="")
    tools = serializers.SerializerMethodField()

    class Meta(ModelCallSerializer.Meta):
        fields = [*ModelCallSerializer.Meta.fields, "system_prompt", "tools"]

    def get_tools(self, obj) -> list[str]:
        if obj.tool_schemas is None:
            return []
        try:
            return [tool["function"]["name"] for tool in json.loads(obj.tool_schemas.content)]
        except (ValueError, KeyError, TypeError):
            return []


class ApprovalSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    session = serializers.UUIDField(source="session_id")
    status = serializers.CharField()
    tool = serializers.CharField()
    call_id = serializers.CharField()
    arguments = serializers.JSONField(source="arguments_redacted")
    risk = serializers.CharField()
    reason = serializers.CharField()
    rule = serializers.JSONField()
    requested_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)
    decided_at = serializers.DateTimeField(allow_null=True)
    decided_by = serializers.SerializerMethodField()
    comment = serializers.CharField()
    executed_at = serializers.DateTimeField(allow_null=True)
    can_decide = serializers.SerializerMethodField(
        help_text="the caller may decide it now: it is pending and its deciders include them"
    )

    def get_decided_by(self, obj) -> str | None:
        return obj.decided_by.get_username() if obj.decided_by_id else None

    def get_can_decide(self, obj) -> bool:
        request = self.context.get("request")
        if request is None or obj.status != ApprovalStatus.PENDING:
            return False
        # With the request's membership and rows from `approvals.with_session_owner`: no query.
        return approvals.may_decide(obj, request.user, getattr(request, "membership", None))


class DecisionSerializer(serializers.Serializer):
    decision = serializers.ChoiceField(choices=list(DECISIONS))
    comment = serializers.CharField(required=False, allow_blank=True, max_length=5000, default="")


class DecisionFrameSerializer(DecisionSerializer):
    """A WebSocket `decide` frame: the REST body plus the approval it is about."""

    approval_id = serializers.IntegerField(min_value=1, max_value=2**63 - 1)


class InputRequestSerializer(serializers.Serializer):
    """An MCP server's question (elicitation) during a tool call, and how it was answered."""

    id = serializers.IntegerField()
    session = serializers.UUIDField(source="session_id")
    call_id = serializers.CharField()
    server = serializers.CharField()
    tool = serializers.CharField()
    message = serializers.CharField()
    schema = serializers.JSONField(help_text="the requested schema: a flat object of primitive fields")
    status = serializers.ChoiceField(choices=InputRequestStatus.choices)
    action = serializers.CharField(help_text="accept/decline/cancel once answered (expired: decline)")
    content = serializers.JSONField(allow_null=True, help_text="the accepted answer")
    requested_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    answered_at = serializers.DateTimeField(allow_null=True)
    answered_by = serializers.SerializerMethodField()
    can_answer = serializers.SerializerMethodField(help_text="the caller may answer it now")

    def get_answered_by(self, obj) -> str | None:
        return obj.answered_by.get_username() if obj.answered_by_id else None

    def get_can_answer(self, obj) -> bool:
        request = self.context.get("request")
        if request is None or obj.status != InputRequestStatus.PENDING:
            return False
        return approvals.may_answer_input(obj, request.user, getattr(request, "membership", None))


class InputAnswerSerializer(serializers.Serializer):
    action = serializers.ChoiceField(choices=InputRequestAction.choices)
    content = serializers.DictField(
        required=False,
        allow_null=True,
        help_text="with accept: the requested fields (checked against the request's schema)",
    )


class InputAnswerFrameSerializer(InputAnswerSerializer):
    """A WebSocket `answer_input` frame: the REST body plus the request it answers."""

    request_id = serializers.IntegerField(min_value=1, max_value=2**63 - 1)


class WorkspaceEntrySerializer(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.IntegerField()
    modified_at = serializers.DateTimeField()
    kind = serializers.ChoiceField(choices=["file", "dir"])


class DeliveredFileSerializer(serializers.Serializer):
    path = serializers.CharField()
    size = serializers.IntegerField()
    sha256 = serializers.CharField()


class ArtifactCheckSerializer(serializers.Serializer):
    path = serializers.CharField()
    check = serializers.CharField(help_text="csv, html, json, markdown, text, image, pdf, exists")
    ok = serializers.BooleanField()
    detail = serializers.CharField()
    facts = serializers.DictField(help_text="what the parser found: rows, columns, header, tables, pages…")


class UnresolvedFailureSerializer(serializers.Serializer):
    call_id = serializers.CharField()
    tool = serializers.CharField()
    summary = serializers.CharField()


class DeliveryDecisionSerializer(serializers.Serializer):
    call_id = serializers.CharField()
    tool = serializers.CharField()
    decision = serializers.ChoiceField(choices=["rejected", "expired", "denied"])
    by = serializers.CharField(allow_null=True)
    comment = serializers.CharField(allow_blank=True)


class DeliverySerializer(serializers.ModelSerializer):
    """A completed turn's delivery record: machine checks by real parsers, never the model's word."""

    turn = serializers.IntegerField(source="turn_id")
    turn_number = serializers.IntegerField(source="turn.number")
    files = DeliveredFileSerializer(many=True)
    checks = ArtifactCheckSerializer(many=True)
    unresolved_failures = UnresolvedFailureSerializer(many=True)
    decisions = DeliveryDecisionSerializer(many=True)
    checks_ok = serializers.BooleanField()
    outcome = serializers.ChoiceField(
        choices=["delivered", "nothing_delivered", "failed"],
        help_text="failed: a failed check or an unresolved failure; nothing_delivered: no file and no check",
    )

    class Meta:
        model = Delivery
        fields = [
            "id",
            "turn",
            "turn_number",
            "final_answer",
            "files",
            "checks",
            "unresolved_failures",
            "decisions",
            "checks_ok",
            "outcome",
            "created_at",
        ]
        read_only_fields = fields


class GoalRunCreateSerializer(serializers.Serializer):
    """`POST …/goal-run/`: the goal and the run's limits (checked between rounds)."""

    goal = StringField(max_length=10_000)
    max_rounds = serializers.IntegerField(min_value=1, max_value=GoalRun.MAX_ROUNDS, default=3)
    token_budget = serializers.IntegerField(
        min_value=1,
        max_value=2**63 - 1,
        default=200_000,
        help_text="prompt + completion tokens the Session may spend while the run is open",
    )
    wall_clock_seconds = serializers.IntegerField(min_value=1, max_value=86_400, default=3_600)

    def validate_goal(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("This field may not be blank.", code="blank")
        return value


class GoalDecisionSerializer(serializers.Serializer):
    decision = serializers.ChoiceField(choices=GoalDecision.choices)
    reason = serializers.CharField()
    round = serializers.IntegerField(help_text="the round after which it was decided (0: none had ended)")


class GoalRunSerializer(serializers.ModelSerializer):
    """A goal run. While it is open, `tokens_used` and `elapsed_seconds` are live; once it ended,
    as of its last decision."""

    tokens_used = serializers.SerializerMethodField()
    elapsed_seconds = serializers.SerializerMethodField()
    last_decision = serializers.SerializerMethodField()

    class Meta:
        model = GoalRun
        fields = [
            "id",
            "goal",
            "status",
            "max_rounds",
            "rounds_done",
            "token_budget",
            "tokens_used",
            "wall_clock_seconds",
            "elapsed_seconds",
            "started_at",
            "ended_at",
            "last_decision",
            "paused_reason",
        ]
        read_only_fields = fields

    def get_tokens_used(self, obj) -> int:
        return goal_driver.tokens_used(obj)

    def get_elapsed_seconds(self, obj) -> int:
        return goal_driver.elapsed_seconds(obj)

    @extend_schema_field(GoalDecisionSerializer(allow_null=True))
    def get_last_decision(self, obj) -> dict | None:
        if not obj.last_decision:
            return None
        return {"decision": obj.last_decision, "reason": obj.last_reason, "round": obj.last_decision_round}
