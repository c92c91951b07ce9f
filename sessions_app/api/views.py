"""Sessions REST API: thin edges over SessionEngine and Brain operations."""

from __future__ import annotations

import time

from django.db.models import Q
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from approvals_app.actions import AlreadyDecided
from approvals_app.choices import ApprovalStatus
from approvals_app.models import PendingApproval
from config.api import Conflict
from tenancy_app.api.viewsets import TenantScopedViewSet

from ..choices import SessionStatus
from ..models import ModelCall, Plan, Session, SessionEvent
from ..runtime import approvals, brain, engine
from .serializers import (
    ApprovalSerializer,
    DecisionSerializer,
    EventSerializer,
    InputCreateSerializer,
    InputSerializer,
    MessageSerializer,
    ModelCallSerializer,
    SessionSerializer,
    SessionUpdateSerializer,
)

MAX_LONG_POLL_S = 30.0
LONG_POLL_INTERVAL_S = 0.2
EVENT_PAGE = 500


def _int_param(request, name: str, default: int = 0) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise serializers.ValidationError({name: f"must be an integer, got {raw!r}"}) from None
    if value < 0:
        raise serializers.ValidationError({name: "must not be negative"})
    return value


class SessionViewSet(
    mixins.ListModelMixin,
    mixins.CreateModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    TenantScopedViewSet,
):
    queryset = Session.objects.filter(archived_at__isnull=True).select_related("model_config")
    serializer_class = SessionSerializer

    @extend_schema(
        parameters=[
            OpenApiParameter("status", str, enum=SessionStatus.values),
            OpenApiParameter("search", str, description="in title and goals"),
        ]
    )
    def list(self, request, *args, **kwargs):
        return super().list(request, *args, **kwargs)

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action != "list":
            return queryset  # ?status= on sub-resources (approvals) means their own status
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

    @extend_schema(request=SessionUpdateSerializer, responses=SessionSerializer)
    def partial_update(self, request, *args, **kwargs):
        session = self.get_object()
        update = SessionUpdateSerializer(data=request.data, partial=True)
        update.is_valid(raise_exception=True)
        session = engine.update_session(session.pk, title=update.validated_data.get("title"))
        return Response(self.get_serializer(session).data)

    def perform_destroy(self, instance):
        engine.archive_session(instance.pk)

    @extend_schema(
        request=InputCreateSerializer,
        responses={202: InputSerializer, 200: InputSerializer},
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
    )
    @action(detail=True, methods=["post"])
    def inputs(self, request, pk=None):
        session = self.get_object()
        body = InputCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        created_input, created = brain.submit_input(
            session,
            kind=body.validated_data["kind"],
            text=body.validated_data["text"],
            attachments=body.validated_data.get("attachments"),
            user=request.user,
            idempotency_key=request.headers.get("Idempotency-Key") or None,
        )
        return Response(
            {"input_id": created_input.pk, "status": created_input.status},
            status=status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK,
        )

    @extend_schema(request=None, responses={202: InputSerializer})
    @action(detail=True, methods=["post"])
    def interrupt(self, request, pk=None):
        session = self.get_object()
        created_input, _ = brain.interrupt(session, user=request.user)
        return Response(
            {"input_id": created_input.pk, "status": created_input.status}, status=status.HTTP_202_ACCEPTED
        )

    @extend_schema(parameters=[OpenApiParameter("after", int)], responses=MessageSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def messages(self, request, pk=None):
        session = self.get_object()
        after = _int_param(request, "after")
        rows = session.messages.filter(id__gt=after).order_by("id")
        return Response(MessageSerializer(rows, many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("after", int),
            OpenApiParameter("wait", OpenApiTypes.FLOAT, description="0..30 s"),
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def events(self, request, pk=None):
        """Events after `after`, in `seq` order; with `wait`, holds the request until one arrives."""
        session = self.get_object()
        after = _int_param(request, "after")
        try:
            wait = min(max(float(request.query_params.get("wait") or 0), 0.0), MAX_LONG_POLL_S)
        except ValueError:
            raise serializers.ValidationError({"wait": "must be a number of seconds (0..30)"}) from None
        deadline = time.monotonic() + wait
        while True:
            rows = list(
                SessionEvent.objects.filter(session=session, seq__gt=after).order_by("seq")[:EVENT_PAGE]
            )
            if rows or time.monotonic() >= deadline:
                break
            time.sleep(LONG_POLL_INTERVAL_S)
        last_seq = rows[-1].seq if rows else max(after, 0)
        return Response({"events": EventSerializer(rows, many=True).data, "last_seq": last_seq})

    @extend_schema(responses=ModelCallSerializer(many=True))
    @action(detail=True, methods=["get"], url_path="model-calls", pagination_class=None)
    def model_calls(self, request, pk=None):
        session = self.get_object()
        rows = (
            ModelCall.objects.filter(session=session)
            .select_related("system_prompt", "tool_schemas")
            .order_by("id")
        )
        return Response(ModelCallSerializer(rows, many=True).data)

    @extend_schema(parameters=[OpenApiParameter("status", str)], responses=ApprovalSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None)
    def approvals(self, request, pk=None):
        session = self.get_object()
        rows = _approval_status_filter(
            request,
            PendingApproval.objects.for_tenant(request.tenant)
            .filter(session_id=session.pk)
            .select_related("decided_by"),
        )
        return Response(ApprovalSerializer(rows, many=True).data)

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["get"], pagination_class=None)
    def plan(self, request, pk=None):
        session = self.get_object()
        plan = Plan.objects.filter(session=session).first()
        return Response({"plan": plan.as_dict() if plan else None})


def _approval_status_filter(request, queryset):
    wanted = request.query_params.get("status")
    if wanted:
        if wanted not in ApprovalStatus.values:
            raise serializers.ValidationError({"status": f"Use one of {', '.join(ApprovalStatus.values)}."})
        queryset = queryset.filter(status=wanted)
    return queryset


class ApprovalViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """Pending and past approvals of the tenant. Deciding goes through the runtime's one
    operation (`approvals.submit_decision`), shared with the WebSocket `decide` frame."""

    queryset = PendingApproval.objects.select_related("decided_by")
    serializer_class = ApprovalSerializer
    pagination_class = None

    @extend_schema(parameters=[OpenApiParameter("status", str, enum=ApprovalStatus.values)])
    def list(self, request, *args, **kwargs):
        rows = _approval_status_filter(request, self.get_queryset())[:500]
        visible = [a for a in rows if approvals.may_see(a, request.user)]
        return Response(ApprovalSerializer(visible, many=True).data)

    @extend_schema(request=DecisionSerializer, responses=ApprovalSerializer)
    @action(detail=True, methods=["post"])
    def decide(self, request, pk=None):
        approval = self.get_object()
        body = DecisionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if not approvals.may_decide(approval, request.user):
            raise PermissionDenied("You may not decide this approval.")
        try:
            approval = approvals.submit_decision(
                approval,
                body.validated_data["decision"],
                user=request.user,
                comment=body.validated_data["comment"],
            )
        except AlreadyDecided as exc:
            raise Conflict("already_decided", f"This approval was already {exc.approval.status}.") from None
        return Response(ApprovalSerializer(approval).data)
