"""Quotas: limits on what a tenant's model calls use per day or month (`Quota`), checked before
every model call.

A runner slice reads the tenant's quotas with its configuration (a saved quota bumps the
tenant's configuration version); before each model call one aggregate query over the period's
calls says whether a quota that applies (the tenant's, the Session owner's) is spent. A spent
one parks the Session as `queued` with reason `quota_exceeded` and a `quota.exceeded` event;
raising the limit (saving the quota) wakes the parked Sessions, and the sweep wakes them when a
new period begins. The check reads committed usage: Sessions whose calls are under way when the
limit is reached each finish that call, so a quota is overshot by at most one call per Session
in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.db.models import F, Q, Sum
from django.utils import timezone

from .choices import QuotaPeriod
from .models import ModelCall, Quota


@dataclass(frozen=True)
class QuotaRule:
    """A quota as a slice keeps it (read with the tenant's configuration)."""

    pk: int
    user_id: int | None
    period: str
    max_tokens: int | None
    max_cost: Decimal | None


@dataclass(frozen=True)
class Exceeded:
    """A spent quota: what the `quota.exceeded` event and the API say."""

    quota_id: int
    scope: str  # "tenant" or "user"
    period: str
    unit: str  # "tokens" or "cost"
    limit: float
    used: float

    def as_event(self) -> dict:
        return {
            "scope": self.scope,
            "limit": self.limit,
            "period": self.period,
            "used": self.used,
            # Extensions of the CONTRACT shape: what the numbers count and who may raise it.
            "unit": self.unit,
            **({"currency": settings.XAGENT_USAGE_CURRENCY} if self.unit == "cost" else {}),
            "quota_id": self.quota_id,
            "raised_by": "an owner or admin of the tenant (admin → Quotas)",
        }

    @property
    def text(self) -> str:
        whose = "the organisation's" if self.scope == "tenant" else "your"
        amount = (
            f"{self.limit:,.0f} tokens"
            if self.unit == "tokens"
            else f"{self.limit:,.4f} {settings.XAGENT_USAGE_CURRENCY}"
        )
        return f"{whose} {self.period}ly quota of {amount} is spent"


def rules(tenant_id) -> tuple[QuotaRule, ...]:
    return tuple(
        QuotaRule(q.pk, q.user_id, q.period, q.max_tokens, q.max_cost)
        for q in Quota.objects.for_tenant(tenant_id).order_by("pk")
    )


def period_start(period: str, now: datetime) -> datetime:
    """Periods start at midnight UTC; a month on its first day."""
    now = now.astimezone(UTC)
    start = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return start.replace(day=1) if period == QuotaPeriod.MONTH else start


def spent(tenant_id, user_id: int | None, quota_rules, now: datetime | None = None) -> Exceeded | None:
    """The first of the quotas that apply to `user_id`'s Sessions (the tenant's and the user's
    own) that is spent now, or None. One query, and none when no quota applies."""
    applying = [rule for rule in quota_rules if rule.user_id is None or rule.user_id == user_id]
    for rule, tokens, cost in _used(tenant_id, applying, now or timezone.now()):
        scope = "tenant" if rule.user_id is None else "user"
        if rule.max_tokens is not None and tokens >= rule.max_tokens:
            return Exceeded(rule.pk, scope, rule.period, "tokens", rule.max_tokens, tokens)
        if rule.max_cost is not None and cost >= rule.max_cost:
            return Exceeded(rule.pk, scope, rule.period, "cost", float(rule.max_cost), float(cost))
    return None


def standing(tenant_id, quota_rules, now: datetime | None = None) -> list[tuple[QuotaRule, int, Decimal]]:
    """Each quota with what its period has used so far: (rule, tokens, cost). One query."""
    return _used(tenant_id, list(quota_rules), now or timezone.now())


def _used(tenant_id, applying: list[QuotaRule], now: datetime) -> list[tuple[QuotaRule, int, Decimal]]:
    """What each quota's current period has used (tokens, cost), in one aggregate over the
    tenant's calls since the earliest period start; nothing to ask when no quota applies."""
    if not applying:
        return []
    sums = {}
    for rule in applying:
        within = Q(started_at__gte=period_start(rule.period, now))
        if rule.user_id is not None:
            within &= Q(session__owner_id=rule.user_id)
        sums[f"tokens_{rule.pk}"] = Sum(F("prompt_tokens") + F("completion_tokens"), filter=within)
        sums[f"cost_{rule.pk}"] = Sum("cost", filter=within)
    earliest = min(period_start(rule.period, now) for rule in applying)
    used = ModelCall.objects.for_tenant(tenant_id).filter(started_at__gte=earliest).aggregate(**sums)
    return [
        (rule, used[f"tokens_{rule.pk}"] or 0, used[f"cost_{rule.pk}"] or Decimal(0)) for rule in applying
    ]


def spent_for_session(session) -> Exceeded | None:
    """`spent` for a Session's owner, reading the tenant's quotas now (outside a slice)."""
    return spent(session.tenant_id, session.owner_id, rules(session.tenant_id))
