from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..choices import SkillSource
from ..models import Skill


class SkillSerializer(serializers.ModelSerializer):
    source = serializers.ChoiceField(
        choices=SkillSource.choices, read_only=True, help_text="the tenant's own Skill, or the operator's"
    )
    version = serializers.IntegerField(read_only=True, help_text="number of the current version")

    class Meta:
        model = Skill
        fields = ["id", "name", "description", "source", "enabled", "version"]
        read_only_fields = fields


class ResourceSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="relative path inside the skill folder, e.g. scripts/run.py")
    size = serializers.IntegerField(help_text="bytes")
    sha256 = serializers.CharField()


@extend_schema_field({"type": "object", "additionalProperties": {"type": "string"}})
class StringMapField(serializers.JSONField):
    pass


class SkillDetailSerializer(SkillSerializer):
    resources = serializers.SerializerMethodField(help_text="the current version's files besides SKILL.md")
    metadata = StringMapField(read_only=True)

    class Meta(SkillSerializer.Meta):
        fields = [
            *SkillSerializer.Meta.fields,
            "body",
            "resources",
            "license",
            "compatibility",
            "metadata",
            "allowed_tools",
            "updated_at",
        ]
        read_only_fields = fields

    @extend_schema_field(ResourceSerializer(many=True))
    def get_resources(self, obj) -> list[dict]:
        from ..packaging import list_resources

        return ResourceSerializer(list_resources(obj), many=True).data
