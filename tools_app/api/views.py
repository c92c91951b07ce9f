"""Tools REST API: what the tenant may use (read-only; admins manage tools in admin)."""

from django.db.models import Q
from rest_framework import mixins

from approvals_app.choices import ToolSource
from config.api import CursorPagination
from tenancy_app.api.viewsets import TenantScopedViewSet

from ..models import Tool
from ..registry import NATIVE_TOOLS
from .serializers import ToolSerializer


class ByName(CursorPagination):
    ordering = "name"


class ToolViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The tools of the tenant (its MCP tools, its own rows) and the global ones, as a Session
    of the tenant resolves them (`tools_app.catalog`): a tenant row hides the global row of the
    same name, and a native row without code behind it is no tool."""

    queryset = Tool.objects.select_related("mcp_server")
    serializer_class = ToolSerializer
    pagination_class = ByName

    def get_queryset(self):
        queryset = super().get_queryset()  # this tenant's rows and the global ones
        if getattr(self, "swagger_fake_view", False):
            return queryset
        own_names = Tool.objects.filter(tenant=self.request.tenant).values("name")
        return queryset.exclude(tenant__isnull=True, name__in=own_names).exclude(
            Q(source=ToolSource.NATIVE) & ~Q(name__in=list(NATIVE_TOOLS))
        )
