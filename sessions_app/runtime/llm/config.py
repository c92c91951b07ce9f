"""Which model a Session talks to: its own ModelConfig, the tenant default, the environment
default (OPENAI_*), or — with no key anywhere — the scripted demo model."""

from __future__ import annotations

from dataclasses import dataclass, replace

from django.conf import settings

from tenancy_app.crypto import decrypt

from ...models import ModelConfig, Session
from ...usage import Prices

DEMO_PROVIDER = "demo"
OPENAI_PROVIDER = "openai"
IN_PROCESS_PROVIDER = "in-process"  # the class XAGENT_MODEL_PROVIDER names


@dataclass(frozen=True)
class EffectiveModel:
    provider: str
    name: str
    model: str
    base_url: str
    api_key: str
    context_window: int
    max_output_tokens: int
    temperature: float | None = None
    # A base URL a tenant admin set: reached only through the outbound guard (tools_app.net).
    guarded: bool = False
    # What its calls cost (None: not priced); stored with each call when it starts.
    prices: Prices | None = None

    def with_max_output(self, tokens: int) -> EffectiveModel:
        """The same model asked for at most `tokens` (a short JSON answer needs no more)."""
        return replace(self, max_output_tokens=min(tokens, self.max_output_tokens))

    @property
    def label(self) -> str:
        return (
            "demo model (scripted, no LLM configured)"
            if self.provider == DEMO_PROVIDER
            else f"{self.name}: {self.model}"
        )


_LOOK_UP = object()


def tenant_default_config(tenant_id) -> ModelConfig | None:
    return ModelConfig.objects.for_tenant(tenant_id).filter(is_default=True).first()


def effective_model_of(config: ModelConfig) -> EffectiveModel:
    return EffectiveModel(
        provider=OPENAI_PROVIDER,
        name=config.name,
        model=config.model,
        base_url=config.base_url,
        # Local OpenAI-compatible servers (vLLM, Ollama) accept any key; the SDK insists on one.
        api_key=decrypt(config.api_key_encrypted) or "not-needed",
        context_window=config.context_window,
        max_output_tokens=config.max_output_tokens,
        temperature=config.temperature,
        guarded=not config.configured_by_operator,
        prices=Prices.of(config),
    )


def resolve_model(session: Session, tenant_default=_LOOK_UP) -> EffectiveModel:
    """`tenant_default`: the tenant's default ModelConfig (or None) when the caller has it
    already — a list of Sessions looks it up once, not once per row."""
    config = session.model_config
    if config is None:
        config = tenant_default_config(session.tenant_id) if tenant_default is _LOOK_UP else tenant_default
    if config is not None:
        return effective_model_of(config)
    if settings.XAGENT_MODEL_PROVIDER:
        return EffectiveModel(
            provider=IN_PROCESS_PROVIDER,
            name="in-process",
            model=settings.XAGENT_MODEL or settings.XAGENT_MODEL_PROVIDER.rpartition(".")[2],
            base_url="",
            api_key="",
            context_window=settings.XAGENT_CONTEXT_WINDOW,
            max_output_tokens=settings.XAGENT_MAX_OUTPUT_TOKENS,
        )
    if settings.OPENAI_API_KEY:
        return EffectiveModel(
            provider=OPENAI_PROVIDER,
            name="default",
            model=settings.XAGENT_MODEL or "gpt-4o-mini",
            base_url=settings.OPENAI_BASE_URL,
            api_key=settings.OPENAI_API_KEY,
            context_window=settings.XAGENT_CONTEXT_WINDOW,
            max_output_tokens=settings.XAGENT_MAX_OUTPUT_TOKENS,
        )
    return EffectiveModel(
        provider=DEMO_PROVIDER,
        name="demo",
        model="xagent-demo",
        base_url="",
        api_key="",
        context_window=settings.XAGENT_CONTEXT_WINDOW,
        max_output_tokens=settings.XAGENT_MAX_OUTPUT_TOKENS,
    )
