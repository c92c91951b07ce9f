"""Usage and cost: what model calls used, priced when they are recorded, and totals over them.

The provider's reported usage is the fact (`ModelCall.prompt_tokens`, `cached_prompt_tokens`,
`completion_tokens`). A call is priced once, when its usage is recorded, with the prices its
model configuration had when the runner read it; those prices are stored with the call
(`params["prices"]`), so a price change applies from the next call on and a recorded cost never
moves. A model without an input and an output price is counted, not priced (`cost` null).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Count, F, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from .models import ModelCall

MILLION = Decimal(1_000_000)
GROUPS = ("user", "model", "session", "day")
DEFAULT_PERIOD_DAYS = 30
# Cost totals go out rounded to this many decimal places (the stored costs keep 8).
COST_PLACES = Decimal("0.000001")


@dataclass(frozen=True)
class Prices:
    """Prices per million tokens. `cached_input`: for prompt tokens served from the provider's
    cache (None: they cost the input price)."""

    input: Decimal
    output: Decimal
    cached_input: Decimal | None = None

    @classmethod
    def of(cls, config) -> Prices | None:
        """A ModelConfig's prices, or None when it has no input or no output price."""
        if config is None or config.input_price is None or config.output_price is None:
            return None
        return cls(config.input_price, config.output_price, config.cached_input_price)

    def as_params(self) -> dict:
        """As stored with a model call (JSON: decimal strings, exact)."""
        return {
            "input": str(self.input),
            "output": str(self.output),
            **({"cached_input": str(self.cached_input)} if self.cached_input is not None else {}),
        }


def call_params(model, **params) -> dict:
    """A model call's `params` as stored when it starts: `params` and, for a priced model
    (`EffectiveModel.prices`), the prices its usage will be priced at."""
    prices = getattr(model, "prices", None)
    return {**params, "prices": prices.as_params()} if prices is not None else params


def call_cost(params: dict | None, prompt_tokens: int, cached_tokens: int, completion_tokens: int):
    """The cost of a call's usage at the prices stored with it (`ModelCall.params`), or None."""
    prices = (params or {}).get("prices")
    if not prices:
        return None
    cached = min(max(cached_tokens, 0), prompt_tokens)
    cached_price = Decimal(prices.get("cached_input") or prices["input"])
    total = (
        (prompt_tokens - cached) * Decimal(prices["input"])
        + cached * cached_price
        + completion_tokens * Decimal(prices["output"])
    )
    return total / MILLION


def recorded_usage(params: dict | None, usage: dict) -> dict:
    """The ModelCall fields that record a provider's reported `usage` (the provider adapter's
    shape: prompt_tokens, completion_tokens, cached_tokens), priced."""
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = int(usage.get("cached_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    return {
        "prompt_tokens": prompt,
        "cached_prompt_tokens": min(cached, prompt),
        "completion_tokens": completion,
        "cost": call_cost(params, prompt, cached, completion),
    }


@dataclass(frozen=True)
class Period:
    since: datetime
    until: datetime


def period(since: datetime | None, until: datetime | None) -> Period:
    """From `since` to `until`; by default the last DEFAULT_PERIOD_DAYS days up to now."""
    end = until if until is not None else timezone.now()
    start = since if since is not None else end - timedelta(days=DEFAULT_PERIOD_DAYS)
    return Period(start, end)


# group_by -> (the values grouped on, how a row's key is made)
_GROUPINGS = {
    "user": (("session__owner_id", "session__owner__username"), lambda row: row["session__owner__username"]),
    "model": (("model",), lambda row: row["model"]),
    "session": (("session_id", "session__title"), lambda row: str(row["session_id"])),
    "day": (("day",), lambda row: row["day"].isoformat()),
}


def totals(tenant_id, group_by: str, within: Period, *, user_id: int | None = None) -> list[dict]:
    """Totals of the tenant's model calls started within the period, one row per group, largest
    cost (then tokens) first. `user_id`: only calls of that user's Sessions."""
    calls = ModelCall.objects.for_tenant(tenant_id).filter(
        started_at__gte=within.since, started_at__lt=within.until
    )
    if user_id is not None:
        calls = calls.filter(session__owner_id=user_id)
    return totals_of(calls, group_by)


def totals_of(calls, group_by: str) -> list[dict]:
    """`totals` over a queryset of model calls someone already chose (admin's filtered list)."""
    if group_by not in GROUPS:
        raise ValueError(f"group_by must be one of {', '.join(GROUPS)}")
    if group_by == "day":
        calls = calls.annotate(day=TruncDate("started_at"))
    fields, key_of = _GROUPINGS[group_by]
    rows = (
        calls.values(*fields)
        .annotate(
            prompt=Sum("prompt_tokens"),
            cached=Sum("cached_prompt_tokens"),
            completion=Sum("completion_tokens"),
            priced=Sum("cost"),
            calls=Count("id"),
        )
        .order_by(*([F("day").asc()] if group_by == "day" else []))
    )
    results = [
        {
            "key": key_of(row),
            **({"title": row["session__title"]} if group_by == "session" else {}),
            "prompt_tokens": row["prompt"] or 0,
            "cached_prompt_tokens": row["cached"] or 0,
            "completion_tokens": row["completion"] or 0,
            "cost": float((row["priced"] or Decimal(0)).quantize(COST_PLACES)),
            "calls": row["calls"],
        }
        for row in rows
    ]
    if group_by != "day":
        results.sort(key=lambda r: (-r["cost"], -(r["prompt_tokens"] + r["completion_tokens"]), r["key"]))
    return results


def currency() -> str:
    return settings.XAGENT_USAGE_CURRENCY
