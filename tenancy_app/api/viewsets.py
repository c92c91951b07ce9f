"""The base every tenant-owned API resource is built on.

Row restriction happens once, in `get_queryset`, for every action (list, retrieve,
update, destroy and custom actions): an object of another tenant is simply not found.
"""

from rest_framework import viewsets


class TenantScopedMixin:
    def get_queryset(self):
        queryset = super().get_queryset()
        if getattr(self, "swagger_fake_view", False):  # schema generation has no tenant
            return queryset.none()
        return queryset.for_tenant(self.request.tenant)

    def perform_create(self, serializer):
        serializer.save(tenant=self.request.tenant)


class TenantScopedViewSet(TenantScopedMixin, viewsets.GenericViewSet):
    pass


class TenantScopedModelViewSet(TenantScopedMixin, viewsets.ModelViewSet):
    pass
