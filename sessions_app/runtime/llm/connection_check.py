"""A model configuration's "Test connection" (admin): can this endpoint be reached with this key,
and which models does it offer?

It asks the endpoint's model list (`GET {base_url}/models`) with the configuration's key, over
the same route a Session's calls take: a base URL a tenant admin set goes through the outbound
guard, so the test cannot reach what a Session could not. One short request, no retries: the
admin waits on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import openai

from tools_app.net import refusal_in

from ...models import ModelConfig
from .config import effective_model_of
from .openai_provider import client_for

CHECK_TIMEOUT = openai.Timeout(connect=5.0, read=10.0, write=10.0, pool=5.0)
# A model list is shown whole up to this many names (some servers offer thousands).
MAX_LISTED_MODELS = 200


@dataclass(frozen=True)
class ConnectionCheck:
    endpoint: str
    guarded: bool
    ok: bool
    models: list[str] = field(default_factory=list)
    more_models: int = 0  # beyond MAX_LISTED_MODELS
    configured_model: str = ""
    error: str = ""

    @property
    def configured_model_offered(self) -> bool:
        return self.configured_model in self.models

    @property
    def summary(self) -> str:
        if not self.ok:
            return f"{self.endpoint}: {self.error}"
        total = len(self.models) + self.more_models
        offered = (
            f"the configured model {self.configured_model!r} is among them"
            if self.configured_model_offered
            else f"the configured model {self.configured_model!r} is not among them"
        )
        return f"{self.endpoint} answered with {total} model(s); {offered}."


def check_connection(config: ModelConfig) -> ConnectionCheck:
    model = effective_model_of(config)
    endpoint = model.base_url or "https://api.openai.com/v1"
    # The Sessions' own client for this endpoint and key (through the outbound guard when a tenant
    # set the URL), with a short timeout and no retries: the admin waits on it.
    client = client_for(model).with_options(timeout=CHECK_TIMEOUT, max_retries=0)
    try:
        page = client.models.list()
        names = sorted({str(getattr(entry, "id", "")) for entry in page.data} - {""})
    except Exception as exc:  # every failure is the answer here, said plainly
        return ConnectionCheck(
            endpoint, model.guarded, ok=False, configured_model=model.model, error=_say(exc)
        )
    return ConnectionCheck(
        endpoint,
        model.guarded,
        ok=True,
        models=names[:MAX_LISTED_MODELS],
        more_models=max(len(names) - MAX_LISTED_MODELS, 0),
        configured_model=model.model,
    )


def _say(exc: Exception) -> str:
    refusal = refusal_in(exc)
    if refusal is not None:
        return f"refused by the outbound guard: {refusal}"
    if isinstance(exc, openai.AuthenticationError):
        return f"the endpoint refused the API key (HTTP 401): {_server_message(exc)}"
    if isinstance(exc, openai.NotFoundError):
        return (
            "the endpoint has no model list here (HTTP 404): check that the base URL ends where the "
            f"API starts (often …/v1). {_server_message(exc)}"
        )
    if isinstance(exc, openai.APIStatusError):
        return f"the endpoint answered HTTP {exc.status_code}: {_server_message(exc)}"
    if isinstance(exc, openai.APITimeoutError):
        return "no answer within 10 seconds"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        return f"could not connect: {cause or exc}"
    return f"the answer could not be read: {exc}"


def _server_message(exc: openai.APIStatusError) -> str:
    """The server's own words: OpenAI's `{"error": {"message": …}}` (the SDK hands the inner
    object as `body`) or a plain `{"message": …}`, else the SDK's summary."""
    body = exc.body
    if isinstance(body, dict):
        inner = body.get("error")
        message = inner.get("message") if isinstance(inner, dict) else body.get("message")
        if message:
            return str(message)[:500]
    return str(exc.message)[:500]
