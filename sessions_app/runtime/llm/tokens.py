"""Token counting for the context budget (ARCHITECTURE §5).

No tokenizer download is possible offline, so the local estimate is character based (≈4
characters per token plus per-message overhead). It only has to be good for what was added
since the provider last reported: a request's count is the last call's `usage.prompt_tokens`
plus the local estimate of what changed since, scaled by how far the estimate was off for this
model (`calibrated`). The estimator is one replaceable function: `XAGENT_TOKEN_ESTIMATOR` names
a `callable(text) -> int` (e.g. a wrapper around a local tokenizer) used instead.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache

from django.conf import settings
from django.utils.module_loading import import_string


def chars_per_token_estimate(text: str) -> int:
    return (len(text) + 3) // 4


@cache
def _estimator():
    path = getattr(settings, "XAGENT_TOKEN_ESTIMATOR", "")
    return import_string(path) if path else chars_per_token_estimate


def estimate_text_tokens(text: str) -> int:
    return _estimator()(text)


def estimate_message_tokens(wire: dict) -> int:
    """One wire message's estimate: made once, when the message is committed."""
    total = 4 + estimate_text_tokens(wire.get("content") or "")
    for call in wire.get("tool_calls") or []:
        total += 4 + estimate_text_tokens(call["function"]["name"] + call["function"]["arguments"])
    return total


def estimate_tools_tokens(tools: list[dict]) -> int:
    return estimate_text_tokens(json.dumps(tools)) if tools else 0


def context_budget(context_window: int, max_output_tokens: int) -> int:
    """What a request may hold: the window, minus room for the answer, minus a safety margin
    for what neither count sees (the provider's chat template, tool-schema framing)."""
    margin = max(settings.XAGENT_CONTEXT_MARGIN_TOKENS, context_window // 20)
    return max(context_window - max_output_tokens - margin, 0)


# How much a count adds to the estimate of what the provider has not counted yet (see `count`).
UNREPORTED_PAD = 0.05
# How far a provider's count may be from ours before we stop trusting the ratio (a bad report).
MIN_RATIO, MAX_RATIO = 0.25, 4.0


@dataclass
class Calibration:
    """What the provider last reported for a request of this Session's history: its prompt
    tokens, our estimate of that same request, and where its history started."""

    reported: int = 0
    estimated: int = 0
    context_start_id: int | None = None

    @property
    def ratio(self) -> float:
        if self.reported <= 0 or self.estimated <= 0:
            return 1.0
        return min(max(self.reported / self.estimated, MIN_RATIO), MAX_RATIO)

    def count(self, estimated_now: int, context_start_id: int | None) -> int:
        """The request's count: the last report plus what was added since (our estimate of the
        difference, scaled by this model's ratio). After the context start moved (a compaction),
        the last report no longer covers a prefix of the request: the scaled estimate alone.
        What no report covers yet is padded (UNREPORTED_PAD): a count that errs must err high,
        or a request the provider counts a few tokens over the budget gets sent."""
        if self.reported <= 0:
            return math.ceil(estimated_now * (1 + UNREPORTED_PAD))
        if context_start_id != self.context_start_id or estimated_now < self.estimated:
            return math.ceil(estimated_now * self.ratio * (1 + UNREPORTED_PAD))
        return self.reported + math.ceil((estimated_now - self.estimated) * self.ratio * (1 + UNREPORTED_PAD))
