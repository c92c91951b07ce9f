"""Skills REST API: what the tenant may use (read-only; Skills are imported in admin or with
`manage.py skill_import`)."""

from rest_framework import mixins

from config.api import CursorPagination
from tenancy_app.api.viewsets import TenantScopedViewSet

from ..catalog import visible
from ..models import Skill
from .serializers import SkillDetailSerializer, SkillSerializer


class ByName(CursorPagination):
    ordering = "name"


class SkillViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, TenantScopedViewSet):
    """The tenant's Skills and the global ones; a tenant Skill hides the global Skill of the same
    name (in the list and by id), as Sessions of the tenant see them."""

    queryset = Skill.objects.all()
    serializer_class = SkillSerializer
    pagination_class = ByName

    def get_serializer_class(self):
        return SkillDetailSerializer if self.action == "retrieve" else SkillSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no tenant
            return Skill.objects.none()
        queryset = visible(self.request.tenant.pk)
        return queryset.defer("body") if self.action == "list" else queryset
