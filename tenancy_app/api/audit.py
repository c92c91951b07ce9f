"""`/api/v1/audit/`: the tenant's audit log, newest first, for its owners and admins. Filters
`actor` (username), `action` (exact, or a prefix ending in `.`: `api_key.`), `object_type`,
`from`/`to`; cursor pagination. `?export=csv` or `?export=jsonl` answers every matching entry
as a download instead of a page (at most EXPORT_LIMIT, newest first)."""

from __future__ import annotations

import json

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import renderers, serializers
from rest_framework.generics import ListAPIView

from config.api import CursorPagination, JSONOnlyNegotiation, ParameterError, query_moment

from .. import audit
from ..models import AuditEntry
from ..permissions import IsTenantAdmin

EXPORT_LIMIT = 100_000


class AuditEntrySerializer(serializers.ModelSerializer):
    actor = serializers.SerializerMethodField()

    class Meta:
        model = AuditEntry
        fields = [
            "id",
            "at",
            "actor",
            "action",
            "object_type",
            "object_id",
            "object_repr",
            "changes",
            "ip",
            "user_agent",
        ]
        read_only_fields = fields

    def get_actor(self, entry) -> dict:
        """`{user?, api_key?}`: who acted (none: the product itself, e.g. a scheduled expiry)."""
        return audit.actor_of(entry)


class _ExportRenderer(renderers.BaseRenderer):
    """Declares an export's media type for the schema: the download itself is streamed by
    `audit.export_response`, and negotiation never picks this renderer (`AuditLogView`)."""

    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return json.dumps(data, default=str).encode()


class CSVRenderer(_ExportRenderer):
    media_type, format = "text/csv", "csv"


class JSONLinesRenderer(_ExportRenderer):
    media_type, format = "application/x-ndjson", "jsonl"


class NewestFirst(CursorPagination):
    ordering = ("-at", "-id")


class AuditLogView(ListAPIView):
    permission_classes = [IsTenantAdmin]
    # A page and an error are JSON whatever `Accept` or `?format=` say; the export renderers only
    # tell the schema the media types `?export=` streams (audit.export_response).
    renderer_classes = [renderers.JSONRenderer, CSVRenderer, JSONLinesRenderer]
    content_negotiation_class = JSONOnlyNegotiation
    serializer_class = AuditEntrySerializer
    pagination_class = NewestFirst

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return AuditEntry.objects.none()
        params = self.request.query_params
        entries = AuditEntry.objects.for_tenant(self.request.tenant)
        if params.get("actor"):
            entries = entries.filter(actor_username=params["actor"])
        action = params.get("action", "")
        if action:
            entries = (
                entries.filter(action__startswith=action)
                if action.endswith(".")
                else entries.filter(action=action)
            )
        if params.get("object_type"):
            entries = entries.filter(object_type=params["object_type"])
        since = query_moment("from", params.get("from"))
        until = query_moment("to", params.get("to"), end_of_day=True)
        if since is not None:
            entries = entries.filter(at__gte=since)
        if until is not None:
            entries = entries.filter(at__lt=until)
        return entries.order_by("-at", "-id")

    @extend_schema(
        parameters=[
            OpenApiParameter("actor", str, description="username"),
            OpenApiParameter("action", str, description="exact, or a prefix ending in '.', e.g. api_key."),
            OpenApiParameter("object_type", str, description="e.g. sessions_app.modelconfig"),
            OpenApiParameter("from", str, description="date or date-time"),
            OpenApiParameter("to", str, description="date (that whole day) or date-time"),
            OpenApiParameter(
                "export", str, enum=["csv", "jsonl"], description="download every match instead of a page"
            ),
        ]
    )
    def get(self, request, *args, **kwargs):
        return self.list(request, *args, **kwargs)

    def list(self, request, *args, **kwargs):
        export = request.query_params.get("export")
        if export is None:
            return super().list(request, *args, **kwargs)
        if export not in ("csv", "jsonl"):
            raise ParameterError("export", "must be csv or jsonl")
        return audit.export_response(
            self.get_queryset()[:EXPORT_LIMIT], export, f"audit-{request.tenant.slug}"
        )
