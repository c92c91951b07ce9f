"""One JSON answer from a stateless call (the `summary`, `task_relation` and `orchestrate` calls of
CONTRACT "Model calls"): asking for it and reading it, the same way for each. What the object
must hold is the caller's to validate."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from .base import CancelSignal, ModelResult
from .config import EffectiveModel
from .providers import provider_for

_FENCED = re.compile(r"```(?:json)?\s*(.*?)\s*```", flags=re.DOTALL)


def json_object(text: str, invalid: type[Exception], what: str = "the answer") -> dict:
    """The JSON object `text` holds (a ```json fence around it is tolerated, as models often add
    one), or `invalid` naming why there is none."""
    body = text.strip()
    fenced = _FENCED.fullmatch(body)
    if fenced:
        body = fenced.group(1)
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise invalid(f"{what} is not JSON ({exc.msg} at {exc.pos})") from None
    except (ValueError, RecursionError):
        raise invalid(f"{what} is not JSON") from None
    if not isinstance(data, dict):
        raise invalid(f"{what} is not a JSON object")
    return data


def ask(
    model: EffectiveModel,
    messages: list[dict],
    *,
    purpose: str,
    read: Callable[[str], object],
    invalid: type[Exception],
    cancel: CancelSignal | None = None,
    what: str = "the answer",
) -> tuple[object, ModelResult]:
    """One call for a JSON answer: (what `read(text)` made of it, the call's result). Raises
    ModelCallFailed, Cancelled, or `invalid` — a truncated answer, or whatever `read` refused —
    with `.result` holding the call's result (its evidence)."""
    result = provider_for(model).complete(messages, [], purpose=purpose, cancel=cancel)
    if result.finish_reason == "length":
        error = invalid(f"{what} was cut off (truncated at the output limit)")
    else:
        try:
            return read(result.text), result
        except invalid as exc:
            error = exc
    error.result = result
    raise error
