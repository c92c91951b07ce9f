"""`/api/v1/usage/`: token and cost totals of the tenant's model calls over a period, grouped by
user, model, Session or day. Members see their own Sessions' usage; owners and admins see
everyone's (`?user=<username>` narrows it to one member)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ParameterError, query_moment
from tenancy_app.choices import ADMIN_ROLES
from tenancy_app.models import Membership

from .. import usage


class UsageRowSerializer(serializers.Serializer):
    key = serializers.CharField(help_text="the username, model name, Session id or day (YYYY-MM-DD)")
    title = serializers.CharField(required=False, help_text="the Session's title (group_by=session)")
    prompt_tokens = serializers.IntegerField()
    cached_prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    cost = serializers.FloatField(help_text="in `currency`; calls of unpriced models count 0")
    calls = serializers.IntegerField()


class UsageView(APIView):
    @extend_schema(
        operation_id="usage_totals",
        parameters=[
            OpenApiParameter("group_by", str, enum=usage.GROUPS, description="default: day"),
            OpenApiParameter("from", str, description="a date or date-time (default: 30 days before `to`)"),
            OpenApiParameter("to", str, description="a date (that whole day) or date-time (default: now)"),
            OpenApiParameter("user", str, description="owners and admins: one member's usage (username)"),
        ],
        responses=inline_serializer(
            "UsageTotals",
            {
                "results": UsageRowSerializer(many=True),
                "currency": serializers.CharField(),
                "group_by": serializers.CharField(),
                "from": serializers.DateTimeField(),
                "to": serializers.DateTimeField(),
            },
        ),
    )
    def get(self, request):
        params = request.query_params
        group_by = params.get("group_by", "day")
        if group_by not in usage.GROUPS:
            raise ParameterError("group_by", f"must be one of {', '.join(usage.GROUPS)}")
        within = usage.period(
            query_moment("from", params.get("from")), query_moment("to", params.get("to"), end_of_day=True)
        )
        if within.since >= within.until:
            raise ParameterError("from", "must be before `to`")
        user_id = self._whose(request)
        return Response(
            {
                "results": usage.totals(request.tenant.pk, group_by, within, user_id=user_id),
                "currency": usage.currency(),
                "group_by": group_by,
                "from": within.since,
                "to": within.until,
            }
        )

    def _whose(self, request) -> int | None:
        """Whose usage the caller may see: a member only their own; an admin everyone's, or that of
        the member `?user=` names (a username that is no member of the tenant is a 400)."""
        username = request.query_params.get("user")
        if request.membership.role not in ADMIN_ROLES:
            if username and username != request.user.get_username():
                raise ParameterError("user", "members see only their own usage")
            return request.user.pk
        if not username:
            return None
        member = (
            Membership.objects.for_tenant(request.tenant)
            .filter(user__username=username)
            .values_list("user_id", flat=True)
            .first()
        )
        if member is None:
            raise ParameterError("user", "no member of this tenant has that username")
        return member
