"""`/api/v1/memories/`: the calling user's long-term memories in this tenant (list, read,
delete). Another user's memory, in this tenant or another, is a 404 like any foreign row."""

from __future__ import annotations

from django.db.models import Q
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status
from rest_framework.response import Response

from config.api import CursorPagination, ParameterError
from tenancy_app.api.viewsets import TenantScopedViewSet

from ..choices import MemoryKind
from ..models import Memory
from ..runtime import memory


class MemorySerializer(serializers.ModelSerializer):
    source_session = serializers.UUIDField(source="source_session_id", read_only=True, allow_null=True)

    class Meta:
        model = Memory
        fields = ["id", "kind", "text", "source_session", "created_at", "updated_at"]
        read_only_fields = fields


class NewestFirst(CursorPagination):
    ordering = ("-updated_at", "-id")


class MemoryViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, TenantScopedViewSet
):
    queryset = Memory.objects.all()
    serializer_class = MemorySerializer
    pagination_class = NewestFirst

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Memory.objects.none()
        return memory.for_user(self.request.tenant.pk, self.request.user.pk)

    @extend_schema(
        parameters=[
            OpenApiParameter("kind", str, enum=MemoryKind.values),
            OpenApiParameter("search", str, description="words in the text"),
        ]
    )
    def list(self, request, *args, **kwargs):
        rows = self.get_queryset()
        kind = request.query_params.get("kind")
        if kind:
            if kind not in MemoryKind.values:
                raise ParameterError("kind", f"must be one of {', '.join(MemoryKind.values)}")
            rows = rows.filter(kind=kind)
        search = request.query_params.get("search", "").strip()[:200]
        if search:
            match = Q()
            for word in search.split()[:8]:
                match &= Q(text__icontains=word)
            rows = rows.filter(match)
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    def destroy(self, request, *args, **kwargs):
        memory.forget(self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
