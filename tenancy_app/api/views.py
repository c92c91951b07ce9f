from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status
from rest_framework.response import Response
from rest_framework.views import APIView

from ..access import list_memberships
from ..actions import do_issue_api_key, do_revoke_api_key
from ..choices import ADMIN_ROLES
from ..models import ApiKey
from .serializers import ApiKeySerializer, IssuedApiKeySerializer, MeSerializer
from .viewsets import TenantScopedViewSet


class MeView(APIView):
    """Who is calling, for which tenant, with which role."""

    @extend_schema(responses=MeSerializer)
    def get(self, request):
        data = {
            "username": request.user.get_username(),
            "tenant": request.tenant,
            "role": request.membership.role,
            "auth": "api_key" if isinstance(request.auth, ApiKey) else "session",
            "memberships": list_memberships(request.user),
        }
        return Response(MeSerializer(data).data)


class ApiKeyViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    TenantScopedViewSet,
):
    """API keys of the current tenant. Members see their own; owners and admins see all.

    `POST` answers the key once, in `key`; `DELETE` revokes (the row stays for audit).
    """

    queryset = ApiKey.objects.select_related("user")
    serializer_class = ApiKeySerializer

    def get_queryset(self):
        queryset = super().get_queryset()
        if getattr(self, "swagger_fake_view", False) or self.request.membership.role in ADMIN_ROLES:
            return queryset
        return queryset.filter(user=self.request.user)

    @extend_schema(request=ApiKeySerializer, responses={201: IssuedApiKeySerializer})
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        key, plaintext = do_issue_api_key(request.tenant, request.user, serializer.validated_data["name"])
        key.key = plaintext
        return Response(IssuedApiKeySerializer(key).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        do_revoke_api_key(instance)
