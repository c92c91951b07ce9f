"""Which provider object answers a model's calls. One place, so an in-process model (a
benchmark's zero-latency one, an embedding application's own) plugs in by dotted path
(`XAGENT_MODEL_PROVIDER`) without the runtime knowing it."""

from __future__ import annotations

from functools import cache

from django.conf import settings
from django.utils.module_loading import import_string

from .config import DEMO_PROVIDER, IN_PROCESS_PROVIDER, OPENAI_PROVIDER, EffectiveModel


def provider_for(model: EffectiveModel):
    """A provider with `complete(messages, tools, *, purpose, on_delta, cancel) -> ModelResult`."""
    if model.provider == IN_PROCESS_PROVIDER:
        return _provider_class(settings.XAGENT_MODEL_PROVIDER)(model)
    return _provider_class(model.provider)(model)


@cache
def _provider_class(provider: str):
    if provider == OPENAI_PROVIDER:
        from .openai_provider import OpenAIChatProvider

        return OpenAIChatProvider
    if provider == DEMO_PROVIDER:
        from .demo import DemoModelProvider

        return DemoModelProvider
    return import_string(provider)
