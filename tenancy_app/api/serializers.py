from rest_framework import serializers

from ..models import ApiKey, Membership, Tenant


class TenantSerializer(serializers.ModelSerializer):
    class Meta:
        model = Tenant
        fields = ["slug", "name"]


class MembershipSerializer(serializers.ModelSerializer):
    tenant = TenantSerializer(read_only=True)

    class Meta:
        model = Membership
        fields = ["tenant", "role"]


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    tenant = TenantSerializer()
    role = serializers.CharField()
    auth = serializers.ChoiceField(choices=["api_key", "session"])
    memberships = MembershipSerializer(many=True)


class ApiKeySerializer(serializers.ModelSerializer):
    user = serializers.CharField(source="user.username", read_only=True)
    is_active = serializers.BooleanField(read_only=True)

    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "user", "is_active", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = ["id", "prefix", "user", "is_active", "created_at", "last_used_at", "revoked_at"]


class IssuedApiKeySerializer(ApiKeySerializer):
    """The one answer that carries the key itself: the response to its creation."""

    key = serializers.CharField(read_only=True)

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]
