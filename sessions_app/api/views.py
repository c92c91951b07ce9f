"""Sessions REST API: thin edges over SessionEngine and Brain operations."""

from __future__ import annotations

from contextlib import contextmanager

from django.db.models import Q
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.response import Response

from approvals_app.actions import AlreadyDecided
from approvals_app.choices import ApprovalStatus
from approvals_app.models import PendingApproval
from config.api import Conflict, ParameterError
from config.schema import error
from tenancy_app.api.viewsets import TenantScopedViewSet
from tenancy_app.models import ApiKey
from tenancy_app.revocation import Principal
from tenancy_app.throttling import caller_ident

from .. import quotas
from ..choices import CallPurpose, InputRequestStatus, InputStatus, QueueReason, SessionStatus
from ..models import InputRequest, ModelCall, Plan, Session
from ..runtime import approvals, brain, engine, goal_driver
from . import longpoll
from .files import SessionFilesMixin
from .pagination import HistoryPagination, SessionListPagination
from .serializers import (
    ApprovalSerializer,
    DecisionSerializer,
    EventSerializer,
    GoalRunCreateSerializer,
    GoalRunSerializer,
    InputAcceptedSerializer,
    InputAnswerSerializer,
    InputCreateSerializer,
    InputRequestSerializer,
    MessageSerializer,
    ModelCallDetailSerializer,
    ModelCallSerializer,
    PlanResponseSerializer,
    SessionDetailSerializer,
    SessionSerializer,
    SessionUpdateSerializer,
    validated_idempotency_key,
)

MAX_INT_PARAM = 2**63 - 1  # ids and seqs are 64-bit: larger values are not "after" anything


def _int_param(request, name: str, default: int = 0) -> int:
    """A non-negative integer query parameter; a bad one is a 400 naming it (`ParameterError`)."""
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    if len(raw) > 20:
        raise ParameterError(name, "must be an integer of at most 19 digits")
    try:
        value = int(raw)
    except ValueError:
        raise ParameterError(name, f"must be an integer, got {raw!r}") from None
    if value < 0:
        raise ParameterError(name, "must not be negative")
    if value > MAX_INT_PARAM:
        raise ParameterError(name, f"must be at most {MAX_INT_PARAM}")
    return value


class SessionViewSet(
    SessionFilesMixin,
    mixins.ListModelMixin,
    mixins.CreateModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    TenantScopedViewSet,
):
    queryset = Session.objects.select_related("model_config")
    pagination_class = SessionListPagination
    serializer_class = SessionSerializer
    # An archived Session keeps its data (for audit) but leaves the work routes: it can be listed
    # (`?archived=true`), read, renamed and restored; anything else answers 404 until restored.
    ARCHIVED_ACTIONS = frozenset({"list", "retrieve", "partial_update", "restore"})

    @extend_schema(
        parameters=[
            OpenApiParameter("status", str, enum=SessionStatus.values),
            OpenApiParameter("search", str, description="in title and goals"),
            OpenApiParameter("archived", bool, description="true: the archived Sessions only"),
        ]
    )
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action in ("list", "retrieve"):
            queryset = queryset.prefetch_related("capabilities")  # one query per page, not per row
        if self.action not in self.ARCHIVED_ACTIONS:
            queryset = queryset.filter(archived_at__isnull=True)
        if self.action != "list":
            return queryset  # ?status= on sub-resources (approvals) means their own status
        queryset = queryset.filter(archived_at__isnull=not self._wants_archived())
        wanted = self.request.query_params.get("status")
        if wanted:
            if wanted not in SessionStatus.values:
                raise serializers.ValidationError(
                    {"status": f"Use one of {', '.join(SessionStatus.values)}."}
                )
            queryset = queryset.filter(status=wanted)
        term = self.request.query_params.get("search")
        if term:
            queryset = queryset.filter(
                Q(title__icontains=term) | Q(session_goal__icontains=term) | Q(phase_goal__icontains=term)
            )
        return queryset

    def get_serializer_class(self):
        if self.action == "retrieve":
            return SessionDetailSerializer
        return super().get_serializer_class()

    def perform_create(self, serializer):
        data = serializer.validated_data
        serializer.instance = engine.create_session(
            tenant=self.request.tenant,
            owner=self.request.user,
            title=data.get("title", ""),
            goal=data.get("goal", ""),
            kind=data.get("kind", "main"),
            parent=data.get("parent"),
            model_config=data.get("model"),
        )

    @extend_schema(request=SessionUpdateSerializer, responses=SessionDetailSerializer)
    def partial_update(self, request, *args, **kwargs):
        session = self.get_object()
        update = SessionUpdateSerializer(data=request.data, partial=True)
        update.is_valid(raise_exception=True)
        data = update.validated_data
        session = engine.update_session(session.pk, title=data.get("title"))
        if "session_goal" in data or "phase_goal" in data:
            # Goals are a person's to change (never the model's): announced, and in every request
            # from the next step on.
            session = engine.update_goals(
                session.pk,
                session_goal=data.get("session_goal"),
                phase_goal=data.get("phase_goal"),
                by=request.user.get_username(),
            )
        return Response(SessionDetailSerializer(session, context=self.get_serializer_context()).data)

    def perform_destroy(self, instance):
        brain.archive(instance, user=self.request.user)

    @extend_schema(request=None, responses=SessionDetailSerializer)
    @action(detail=True, methods=["post"])
    def restore(self, request, pk=None):
        """Un-archive: the Session is back in the lists and its routes, as it was."""
        session = self.get_object()
        engine.restore_session(session.pk)
        session = self.get_queryset().get(pk=session.pk)
        return Response(SessionDetailSerializer(session, context=self.get_serializer_context()).data)

    def _wants_archived(self) -> bool:
        raw = self.request.query_params.get("archived", "false").strip().lower()
        if raw not in ("true", "false", "1", "0", ""):
            raise serializers.ValidationError({"archived": "Use true or false."})
        return raw in ("true", "1")

    @extend_schema(
        request=InputCreateSerializer,
        responses={202: InputAcceptedSerializer, 200: InputAcceptedSerializer},
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
    )
    @action(detail=True, methods=["post"])
    def inputs(self, request, pk=None):
        session = self.get_object()
        body = InputCreateSerializer(data=request.data, context={"workspace": engine.workspace_path(session)})
        body.is_valid(raise_exception=True)
        created_input, created = brain.submit_input(
            session,
            kind=body.validated_data["kind"],
            text=body.validated_data["text"],
            attachments=body.validated_data.get("attachments"),
            user=request.user,
            idempotency_key=validated_idempotency_key(request),
            caller=caller_ident(request),
        )
        accepted = {"input_id": created_input.pk, "status": created_input.status}
        if created_input.status == InputStatus.QUEUED and quotas.spent_for_session(session) is not None:
            # Kept, and taken up when the quota is raised or renews (`quota.exceeded` says which).
            accepted["reason"] = QueueReason.QUOTA_EXCEEDED
        return Response(accepted, status=status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK)

    @extend_schema(request=None, responses={202: InputAcceptedSerializer})
    @action(detail=True, methods=["post"])
    def interrupt(self, request, pk=None):
        session = self.get_object()
        created_input, _ = brain.interrupt(session, user=request.user)
        return Response(
            {"input_id": created_input.pk, "status": created_input.status}, status=status.HTTP_202_ACCEPTED
        )

    @extend_schema(
        parameters=[OpenApiParameter("after", int, description="only messages with a greater id")],
        responses=MessageSerializer(many=True),
    )
    @action(detail=True, methods=["get"], pagination_class=HistoryPagination)
    def messages(self, request, pk=None):
        session = self.get_object()
        after = _int_param(request, "after")
        page = self.paginate_queryset(
            session.messages.filter(id__gt=after).select_related("input__created_by")
        )
        return self.get_paginated_response(MessageSerializer(page, many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "after",
                {"type": "integer", "minimum": 0},
                description="only events with a greater `seq` (default 0)",
            ),
            OpenApiParameter(
                "wait",
                {"type": "number", "minimum": 0, "maximum": 30},
                description="long poll: when no event follows `after` yet, wait up to this many "
                "seconds (0..30) for one; the answer comes as soon as one is logged",
            ),
        ],
        responses={
            200: inline_serializer(
                "EventPage",
                {"events": EventSerializer(many=True), "last_seq": serializers.IntegerField()},
            )
        },
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def events(self, request, pk=None):
        """The Session's events after `after`, in `seq` order (at most 500 per answer)."""
        # The route is served by `longpoll.session_events`: it runs this action first and, when
        # the action hands back a `long_poll`, waits without holding a database connection.
        session = self.get_object()
        after = _int_param(request, "after")
        wait = longpoll.parse_wait(request.query_params.get("wait"))
        page = longpoll.read_events(session.pk, after)
        response = Response(page)
        if wait > 0 and not page["events"]:
            key_id = request.auth.pk if isinstance(request.auth, ApiKey) else None
            response.long_poll = longpoll.LongPoll(
                session.pk, after, wait, caller_ident(request), Principal.of(request.membership, key_id)
            )
        return response

    @extend_schema(
        parameters=[OpenApiParameter("purpose", str, enum=CallPurpose.values)],
        responses=ModelCallSerializer(many=True),
    )
    @action(detail=True, methods=["get"], url_path="model-calls", pagination_class=HistoryPagination)
    def model_calls(self, request, pk=None):
        session = self.get_object()
        rows = ModelCall.objects.filter(session=session).select_related("system_prompt", "tool_schemas")
        purpose = request.query_params.get("purpose")
        if purpose:
            if purpose not in CallPurpose.values:
                raise ParameterError("purpose", f"must be one of {', '.join(CallPurpose.values)}")
            rows = rows.filter(purpose=purpose)
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(ModelCallSerializer(page, many=True).data)

    @extend_schema(
        operation_id="sessions_model_calls_retrieve",
        parameters=[OpenApiParameter("call_id", int, OpenApiParameter.PATH)],
        responses=ModelCallDetailSerializer,
    )
    def model_call_detail(self, request, pk=None, call_id=None):
        """One request's evidence with what it carried besides the history: the system prompt
        as sent (goals, plan, loaded Skills, recalled memories — their texts only for the
        Session's owner —, continuity state) and the tool names offered. The history it sent is
        `first_message_id`..`last_message_id`."""
        session = self.get_object()
        call = (
            ModelCall.objects.filter(session=session, pk=call_id)
            .select_related("system_prompt", "tool_schemas")
            .first()
        )
        if call is None:
            raise NotFound("No model call matches the given query.")
        data = ModelCallDetailSerializer(call).data
        if session.owner_id != request.user.pk:
            # The Session is the tenant's to see; the owner's recalled memories are not.
            data["system_prompt"] = engine.without_memories(data["system_prompt"])
        return Response(data)

    @extend_schema(
        parameters=[OpenApiParameter("status", str, enum=ApprovalStatus.values)],
        responses=ApprovalSerializer(many=True),
    )
    @action(detail=True, methods=["get"], pagination_class=HistoryPagination)
    def approvals(self, request, pk=None):
        session = self.get_object()
        visible = approvals.visible_to(PendingApproval.objects.all(), request.user, request.membership)
        rows = _approval_status_filter(
            request,
            approvals.with_session_owner(visible.filter(session_id=session.pk).select_related("decided_by")),
        )
        page = self.paginate_queryset(rows)
        context = self.get_serializer_context()
        return self.get_paginated_response(ApprovalSerializer(page, many=True, context=context).data)

    # --- MCP input requests (elicitation; runtime/engine/elicitation.py) -----------------------------

    @extend_schema(
        parameters=[OpenApiParameter("status", str, enum=InputRequestStatus.values)],
        responses=InputRequestSerializer(many=True),
    )
    @action(detail=True, methods=["get"], url_path="input-requests", pagination_class=HistoryPagination)
    def input_requests(self, request, pk=None):
        """Questions MCP servers asked during this Session's tool calls, oldest first."""
        rows = _input_requests(request, self.get_object())
        wanted = request.query_params.get("status")
        if wanted:
            if wanted not in InputRequestStatus.values:
                raise ParameterError("status", f"must be one of {', '.join(InputRequestStatus.values)}")
            rows = rows.filter(status=wanted)
        page = self.paginate_queryset(rows)
        context = self.get_serializer_context()
        return self.get_paginated_response(InputRequestSerializer(page, many=True, context=context).data)

    @extend_schema(
        operation_id="sessions_input_requests_retrieve",
        parameters=[OpenApiParameter("request_id", int, OpenApiParameter.PATH)],
        responses=InputRequestSerializer,
    )
    def input_request_detail(self, request, pk=None, request_id=None):
        row = _input_request_or_404(request, self.get_object(), request_id)
        return Response(InputRequestSerializer(row, context=self.get_serializer_context()).data)

    @extend_schema(
        operation_id="sessions_input_requests_answer",
        summary="Answer an MCP server's question: accept (with content fitting its schema), decline or cancel",
        parameters=[OpenApiParameter("request_id", int, OpenApiParameter.PATH)],
        request=InputAnswerSerializer,
        responses={
            200: InputRequestSerializer,
            409: error("`already_decided`: the request was answered, expired or cancelled before."),
        },
    )
    def input_request_answer(self, request, pk=None, request_id=None):
        row = _input_request_or_404(request, self.get_object(), request_id)
        body = InputAnswerSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if not approvals.may_answer_input(row, request.user, request.membership):
            raise PermissionDenied("You may not answer this request.")
        try:
            row = engine.answer_input(
                row, body.validated_data["action"], body.validated_data.get("content"), user=request.user
            )
        except engine.InvalidAnswer as exc:
            raise serializers.ValidationError({"content": exc.errors}) from None
        except engine.AlreadyAnswered as exc:
            raise Conflict("already_decided", f"This request was already {exc.request.status}.") from None
        return Response(InputRequestSerializer(row, context=self.get_serializer_context()).data)

    @extend_schema(responses=PlanResponseSerializer)
    @action(detail=True, methods=["get"], pagination_class=None)
    def plan(self, request, pk=None):
        session = self.get_object()
        plan = Plan.objects.filter(session=session).first()
        return Response({"plan": plan.as_dict() if plan else None})

    # --- the goal driver (runtime/goal_driver.py): one run per Session at a time ---------------------

    @extend_schema(
        methods=["GET"],
        summary="The Session's goal run: the open one, else the latest (404 when it never had one)",
        responses=GoalRunSerializer,
    )
    @extend_schema(
        methods=["POST"],
        summary="Start a goal run: round 1 is queued as a message; the driver decides after each round",
        request=GoalRunCreateSerializer,
        responses={
            201: GoalRunSerializer,
            409: error("`goal_run_active`: the Session already has an active or paused goal run."),
        },
    )
    @action(detail=True, methods=["get", "post"], url_path="goal-run", pagination_class=None)
    def goal_run(self, request, pk=None):
        session = self.get_object()
        if request.method == "GET":
            return Response(GoalRunSerializer(_goal_run_or_404(session)).data)
        body = GoalRunCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        with _goal_run_errors():
            run = goal_driver.start(session.pk, user=request.user, **body.validated_data)
        return Response(GoalRunSerializer(run).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        summary="Resume a goal run paused by recovery (an active one: unchanged)",
        request=None,
        responses={200: GoalRunSerializer, 409: error("`goal_run_finished`: the run is done or stopped.")},
    )
    @action(detail=True, methods=["post"], url_path="goal-run/resume", pagination_class=None)
    def goal_run_resume(self, request, pk=None):
        session = self.get_object()
        with _goal_run_errors():
            run = goal_driver.resume(session.pk, user=request.user)
        return Response(GoalRunSerializer(run).data)

    @extend_schema(
        summary="Stop a goal run: no further round (a round already running is not interrupted)",
        request=None,
        responses={200: GoalRunSerializer, 409: error("`goal_run_finished`: the run is done.")},
    )
    @action(detail=True, methods=["post"], url_path="goal-run/stop", pagination_class=None)
    def goal_run_stop(self, request, pk=None):
        session = self.get_object()
        with _goal_run_errors():
            run = goal_driver.stop(session.pk, user=request.user)
        return Response(GoalRunSerializer(run).data)


def _input_requests(request, session):
    return (
        InputRequest.objects.for_tenant(request.tenant).filter(session=session).select_related("answered_by")
    )


def _input_request_or_404(request, session, request_id):
    try:
        wanted = int(request_id)
    except (TypeError, ValueError):
        wanted = None
    row = (
        _input_requests(request, session).filter(pk=wanted).first()
        if wanted and wanted < MAX_INT_PARAM
        else None
    )
    if row is None:
        raise NotFound("No input request matches the given query.")
    return row


def _goal_run_or_404(session):
    run = goal_driver.current_run(session.pk)
    if run is None:
        raise NotFound("This Session has no goal run.")
    return run


@contextmanager
def _goal_run_errors():
    try:
        yield
    except goal_driver.NoGoalRun:
        raise NotFound("This Session has no goal run.") from None
    except goal_driver.GoalRunError as exc:
        raise Conflict(exc.code, exc.message) from None


def _approval_status_filter(request, queryset):
    wanted = request.query_params.get("status")
    if wanted:
        if wanted not in ApprovalStatus.values:
            raise serializers.ValidationError({"status": f"Use one of {', '.join(ApprovalStatus.values)}."})
        queryset = queryset.filter(status=wanted)
    return queryset


class ApprovalViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """Pending and past approvals of the tenant the caller may see (`approvals.visible_to`, for
    every action: one they may not see is a 404). Deciding goes through the runtime's one
    operation (`brain.submit_decision`), shared with the WebSocket `decide` frame."""

    queryset = PendingApproval.objects.select_related("decided_by")
    serializer_class = ApprovalSerializer

    def get_queryset(self):
        membership = getattr(self.request, "membership", None)  # absent while generating the schema
        visible = approvals.visible_to(super().get_queryset(), self.request.user, membership)
        return approvals.with_session_owner(visible)  # `can_decide` without a query per row

    @extend_schema(parameters=[OpenApiParameter("status", str, enum=ApprovalStatus.values)])
    def list(self, request, *args, **kwargs):
        page = self.paginate_queryset(_approval_status_filter(request, self.get_queryset()))
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @extend_schema(
        request=DecisionSerializer,
        responses={
            200: ApprovalSerializer,
            409: error("`already_decided`: the approval was decided before."),
        },
    )
    @action(detail=True, methods=["post"])
    def decide(self, request, pk=None):
        approval = self.get_object()
        body = DecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if not approvals.may_decide(approval, request.user, request.membership):
            raise PermissionDenied("You may not decide this approval.")
        try:
            approval = brain.submit_decision(
                approval,
                body.validated_data["decision"],
                user=request.user,
                comment=body.validated_data["comment"],
            )
        except AlreadyDecided as exc:
            raise Conflict("already_decided", f"This approval was already {exc.approval.status}.") from None
        return Response(self.get_serializer(approval).data)
