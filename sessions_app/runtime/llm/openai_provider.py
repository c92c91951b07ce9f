"""OpenAIChatProvider: streamed Chat Completions against any OpenAI-compatible endpoint.

A tenant-set base URL (`EffectiveModel.guarded`) is reached through the outbound guard's
transport, which checks the resolved address at every connect; a refusal fails the call at
once (no retries) with a message naming the rule.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx2
import openai
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from openai import Stream
from openai.types.chat import ChatCompletion

from config.dbconn import hand_back_connections
from tools_app.net import guarded_transport, refusal_in

from .base import Cancelled, CancelSignal, EncodedMessages, ModelCallFailed, ModelResult
from .config import EffectiveModel

logger = logging.getLogger(__name__)

# Retries are ours, not the SDK's (`max_retries=0`): each attempt's error is evidence on the
# model call, the wait between attempts ends at once on an interrupt, a refusal by the outbound
# guard is never retried, and a stream that fails midway is retried whole (the SDK retries
# only the opening request). Like the SDK, a server's Retry-After is honoured (capped).
MAX_ATTEMPTS = 3
BACKOFF_S = (0.5, 2.0)
MAX_RETRY_AFTER_S = 30.0
# Connect fast, but let a slow model think: the read timeout bounds silence between chunks.
TIMEOUT = openai.Timeout(connect=10.0, read=120.0, write=30.0, pool=10.0)

_TRANSIENT = (
    openai.APIConnectionError,
    openai.APITimeoutError,
    openai.RateLimitError,
    openai.InternalServerError,
)


def _is_transient(exc: Exception) -> bool:
    # A server may say itself whether a retry can help (the SDK honours the same header).
    response = getattr(exc, "response", None)
    should_retry = response.headers.get("x-should-retry") if response is not None else None
    if should_retry in ("true", "false"):
        return should_retry == "true"
    if isinstance(exc, (*_TRANSIENT, AnswerTimeout)):
        return True
    return isinstance(exc, openai.APIStatusError) and exc.status_code >= 500


# The outer loop's stateless calls (CONTRACT "Model calls"): one JSON answer each, asked without
# streaming — nobody watches them being written, and a whole body is simpler to validate.
NON_STREAMING_PURPOSES = frozenset({"task_relation", "orchestrate"})


def _limits_for(purpose: str) -> tuple[int, openai.Timeout]:
    """(attempts, timeout) of a call. A summary call holds the turn in `compressing` and has a
    deterministic fallback (a trim); the outer loop's calls hold it in `preparing`, and the turn
    runs anyway when they fail. So they get one retry and a shorter read timeout instead of
    making the user wait minutes on a hanging endpoint."""
    if purpose == "summary":
        seconds = float(settings.XAGENT_SUMMARY_TIMEOUT_SECONDS)
        return 2, openai.Timeout(connect=10.0, read=seconds, write=30.0, pool=10.0)
    if purpose in NON_STREAMING_PURPOSES:
        seconds = float(settings.XAGENT_PREPARE_TIMEOUT_SECONDS)
        return 2, openai.Timeout(connect=10.0, read=seconds, write=30.0, pool=10.0)
    return MAX_ATTEMPTS, TIMEOUT


# One client (and its connection pool) per endpoint, key and guard per process, shared by every
# step and thread: building one per step cost a TLS handshake and a new pool each time. A
# changed configuration (URL, key) is a new key here; the old client ages out.
MAX_CACHED_CLIENTS = 32
_clients: OrderedDict[tuple, openai.OpenAI] = OrderedDict()
_clients_lock = threading.Lock()


def connection_limits() -> httpx2.Limits:
    """One client per endpoint serves every Session this process drives at once, each holding a
    connection for its stream: keep that many alive. The SDK's default keeps 100 (httpx's, behind
    a custom transport, 20 of at most 100): a worker driving 200 Sessions on one endpoint opened
    a new connection (a TLS handshake, on a real provider) for every other answer, or waited for
    a free one."""
    sessions = max(settings.XAGENT_WORKER_SESSIONS, settings.XAGENT_EMBEDDED_WORKER_THREADS)
    return httpx2.Limits(max_connections=max(1000, sessions), max_keepalive_connections=sessions)


def client_for(model: EffectiveModel) -> openai.OpenAI:
    key = (model.base_url, model.api_key, model.guarded)
    with _clients_lock:
        client = _clients.get(key)
        if client is not None:
            _clients.move_to_end(key)
            return client
        limits = connection_limits()
        # With an explicit transport httpx ignores the client's `limits`: the transport takes them.
        http_client = openai.DefaultHttpxClient(
            limits=limits, transport=guarded_transport(limits=limits) if model.guarded else None
        )
        client = openai.OpenAI(
            base_url=model.base_url or None,
            api_key=model.api_key,
            max_retries=0,
            timeout=TIMEOUT,
            http_client=http_client,
        )
        _clients[key] = client
        while len(_clients) > MAX_CACHED_CLIENTS:
            # Not closed: another thread may be streaming through it; its pool is freed with it.
            _clients.popitem(last=False)
        return client


def _retry_after(exc: Exception) -> float | None:
    """How long the server asked us to wait (OpenAI's `retry-after-ms`, else `retry-after` in
    seconds), capped; None when it did not say."""
    response = getattr(exc, "response", None)
    if response is None:
        return None
    for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            return min(max(float(response.headers[header]) * scale, 0.0), MAX_RETRY_AFTER_S)
        except (KeyError, ValueError):
            continue
    return None


def uses_max_completion_tokens(model: EffectiveModel) -> bool:
    """OpenAI's own API takes `max_completion_tokens` (its reasoning models refuse `max_tokens`);
    OpenAI-compatible servers (vLLM, Ollama, LiteLLM, …) all take `max_tokens`, not all the other."""
    host = urlsplit(model.base_url).hostname if model.base_url else "api.openai.com"
    return host == "api.openai.com"


def request_body(
    model: EffectiveModel, messages: list[dict], tools: list[dict], *, stream: bool = True
) -> bytes:
    """The Chat Completions body, with the history spliced in from the messages' own encodings
    when they carry them (EncodedMessages) instead of encoding it again."""
    params = {"model": model.model, "stream": stream}
    if stream:
        params["stream_options"] = {"include_usage": True}
    params["max_completion_tokens" if uses_max_completion_tokens(model) else "max_tokens"] = (
        model.max_output_tokens
    )
    if model.temperature is not None:
        params["temperature"] = model.temperature
    encoded = (
        messages.json_array()
        if isinstance(messages, EncodedMessages)
        else json.dumps(messages, ensure_ascii=False)
    )
    head = json.dumps(params, ensure_ascii=False)[:-1]
    if tools:
        head += f', "tools": {_encoded_tools(tools)}'
    return f'{head}, "messages": {encoded}}}'.encode()


_ENCODED_TOOLS: dict[int, tuple[list, str]] = {}
_ENCODED_TOOLS_KEPT = 512


def _encoded_tools(tools: list[dict]) -> str:
    """The tool schemas as JSON, encoded once per list: a slice sends the same list (dozens of
    schemas) with every step of its turn. Keyed by the list's identity, checked, so a list
    garbage-collected and another allocated at its address is encoded afresh."""
    kept = _ENCODED_TOOLS.get(id(tools))
    if kept is not None and kept[0] is tools:
        return kept[1]
    encoded = json.dumps(tools, ensure_ascii=False)
    if len(_ENCODED_TOOLS) >= _ENCODED_TOOLS_KEPT:
        _ENCODED_TOOLS.clear()
    _ENCODED_TOOLS[id(tools)] = (tools, encoded)  # holds the list: its id stays its own
    return encoded


# A reported count is the server's word: kept within what the evidence columns hold (a negative
# or absurd number would otherwise fail the commit of the step it belongs to).
MAX_REPORTED_TOKENS = 2**31 - 1


def _usage(usage) -> dict:
    def count(value) -> int:
        try:
            return min(max(int(value or 0), 0), MAX_REPORTED_TOKENS)
        except (TypeError, ValueError, OverflowError):
            return 0

    if not isinstance(usage, dict):
        usage = usage.model_dump()
    # Prompt tokens the provider served from its cache (OpenAI: prompt_tokens_details); they are
    # part of prompt_tokens and may cost less (ModelConfig.cached_input_price).
    details = usage.get("prompt_tokens_details")
    return {
        "prompt_tokens": count(usage.get("prompt_tokens")),
        "completion_tokens": count(usage.get("completion_tokens")),
        "cached_tokens": count(details.get("cached_tokens")) if isinstance(details, dict) else 0,
    }


class AnswerTimeout(Exception):
    """No whole answer within the call's wall-clock limit (a server trickling bytes slower than
    the read timeout would otherwise hold the call without bound)."""


def _post_until_cancelled(
    post: Callable[[], Stream], cancel: CancelSignal | None, deadline: float | None = None
):
    """`post()` — which returns once the response headers arrive (or, not streaming, the whole
    answer) — unless the user interrupts first, or `deadline` seconds pass (AnswerTimeout): a
    model that thinks for a minute before its first byte must not hold an interrupt that long.
    The request then finishes in its thread, and its stream is closed unread."""
    cancel = cancel if cancel is not None else CancelSignal()
    outcome: dict = {}
    done = threading.Event()
    abandoned = threading.Event()  # past the deadline: nobody reads what arrives

    def run():
        try:
            outcome["stream"] = post()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            done.set()
            close = getattr(outcome.get("stream"), "close", None)  # a whole answer has nothing open
            if (cancel.is_set() or abandoned.is_set()) and close is not None:
                close()

    threading.Thread(target=run, name="model-request", daemon=True).start()
    unregister = cancel.on_cancel(done.set)
    try:
        finished = done.wait(deadline)
    finally:
        unregister()
    if not finished:
        abandoned.set()
        raise AnswerTimeout(f"timed out: no whole answer within {deadline:g} s")
    if "error" in outcome:
        raise outcome["error"]
    if "stream" not in outcome:  # interrupted before the answer began
        raise Cancelled()
    return outcome["stream"]


class OpenAIChatProvider:
    def __init__(self, model: EffectiveModel):
        self.model = model
        self.client = client_for(model)

    def complete(
        self,
        messages: list[dict],
        tools: list[dict],
        *,
        purpose: str,
        on_delta: Callable[[str], None] | None = None,
        cancel: CancelSignal | None = None,
    ) -> ModelResult:
        # Every model call is a wait of seconds (the agent's steps, the outer loop's and the
        # summary's calls alike): the thread's pooled database connection serves others meanwhile.
        hand_back_connections()
        errors: list[str] = []
        attempts, timeout = _limits_for(purpose)
        for attempt in range(1, attempts + 1):
            try:
                if purpose in NON_STREAMING_PURPOSES:
                    result = self._request_once(messages, tools, purpose, cancel, timeout)
                else:
                    result = self._stream_once(messages, tools, purpose, on_delta, cancel, timeout)
                result.attempts, result.attempt_errors = attempt, errors
                return result
            except (Cancelled, SoftTimeLimitExceeded):  # the slice's time limit is not a model error
                raise
            except Exception as exc:
                if cancel is not None and cancel.is_set():
                    raise Cancelled() from exc
                refused = refusal_in(exc)
                if refused is not None:
                    errors.append(str(refused)[:500])
                    raise ModelCallFailed(errors[-1], attempt, errors) from exc
                errors.append(f"{exc.__class__.__name__}: {exc}"[:500])
                if not _is_transient(exc) or attempt == attempts:
                    raise ModelCallFailed(errors[-1], attempt, errors) from exc
                delay = _retry_after(exc) or BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)]
                logger.warning(
                    "model call attempt %s failed (%s); retrying in %.1fs", attempt, errors[-1], delay
                )
                if cancel is not None and cancel.wait(delay):
                    raise Cancelled() from exc
        raise AssertionError("unreachable")

    def _request_once(self, messages, tools, purpose, cancel, timeout) -> ModelResult:
        """One non-streaming completion (the outer loop's JSON calls)."""

        def post() -> ChatCompletion:
            return self.client.post(
                "/chat/completions",
                cast_to=ChatCompletion,
                content=request_body(self.model, messages, tools, stream=False),
                options={
                    "headers": {"Content-Type": "application/json", "X-XAgent-Call": purpose},
                    "timeout": timeout,
                },
            )

        # A whole answer within the call's limit, however slowly the server sends its bytes.
        completion = _post_until_cancelled(post, cancel, deadline=timeout.read)
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        if not isinstance(completion, ChatCompletion):
            raise ValueError("the endpoint answered something that is not a chat completion")
        result = ModelResult()
        if completion.usage is not None:
            result.usage = _usage(completion.usage)
        choice = (completion.choices or [None])[0]
        if choice is None or choice.message is None:
            result.finish_reason = "length"  # an answer without a message: nothing to read
            return result
        result.text = choice.message.content or ""
        result.finish_reason = choice.finish_reason or "length"
        return result

    def _stream_once(self, messages, tools, purpose, on_delta, cancel, timeout) -> ModelResult:
        # The body goes through the SDK's own request path (its client, auth, headers, errors
        # and streaming parser) already encoded: `chat.completions.create` would walk and
        # re-validate the whole history on every call, the largest cost of a step, growing
        # with history. Our messages are wire dicts we built ourselves. Chunks come back as the
        # decoded JSON (`Stream[object]`): building a pydantic model for every chunk was a tenth
        # of a step's CPU, and `_read_chunk` reads only the few fields a step needs.
        def post() -> Stream[object]:
            return self.client.post(
                "/chat/completions",
                cast_to=object,
                content=request_body(self.model, messages, tools),
                options={
                    "headers": {"Content-Type": "application/json", "X-XAgent-Call": purpose},
                    "timeout": timeout,
                },
                stream=True,
                stream_cls=_PooledStream,
            )

        stream = post() if cancel is None else _post_until_cancelled(post, cancel)
        # Interrupt closes the HTTP response from the watcher thread, which ends the read loop.
        unregister = cancel.on_cancel(stream.close) if cancel is not None else (lambda: None)
        result = ModelResult()
        calls: dict[int, dict] = {}
        text_parts: list[str] = []
        try:
            for chunk in stream:
                if cancel is not None and cancel.is_set():
                    raise Cancelled()
                _read_chunk(chunk, result, calls, text_parts, on_delta)
        except Cancelled:
            raise
        except Exception:
            if cancel is not None and cancel.is_set():
                raise Cancelled() from None
            raise
        finally:
            unregister()
            stream.close()
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        result.text = "".join(text_parts)
        result.tool_calls = [calls[i] for i in sorted(calls)]
        for index, call in enumerate(result.tool_calls):
            call["id"] = call["id"] or f"call_{index}"
        if not result.finish_reason:
            # A stream that ended without a finish reason was cut off: treat it like `length`.
            result.finish_reason = "length"
        return result


class _PooledStream(Stream[object]):
    """The SDK's stream of decoded chunks, which also reads the body to its end after `[DONE]`.

    The SDK stops reading at `[DONE]` and closes the response with the chunked body's last few
    bytes unread, so the HTTP client drops the connection instead of pooling it: every step
    opened a new connection to its model (on a real provider, a TLS handshake). The rest of the
    body comes right behind `[DONE]`. A server that goes on sending after it is cut off after
    DRAIN_AFTER_DONE_S (the connection is then dropped, as before); one that stalls is stopped
    like one that stalls mid-answer (the read timeout, an interrupt, the step time limit)."""

    DRAIN_AFTER_DONE_S = 1.0
    _drain_until: float | None = None

    def _iter_events(self):
        # The SDK's decoder reads the body through `response.iter_bytes`: bounded here, because
        # what a server sends after `[DONE]` may be comments the decoder swallows, never yielding
        # an event this loop could stop at.
        body = self.response.iter_bytes

        def bounded():
            for chunk in body():
                yield chunk
                if self._drain_until is not None and time.monotonic() > self._drain_until:
                    return

        self.response.iter_bytes = bounded
        events = super()._iter_events()
        for event in events:
            if event.data.startswith("[DONE]"):
                self._drain_until = time.monotonic() + self.DRAIN_AFTER_DONE_S
                for _ in events:
                    pass
            yield event


class MalformedChunk(ValueError):
    """A stream chunk that is not shaped like a chat completion chunk (a broken proxy or
    server): the call fails with this message as its error (not retried: the same server
    would answer the same way)."""


def _read_chunk(chunk, result: ModelResult, calls: dict, text_parts: list, on_delta) -> None:
    """Fold one decoded chunk into the answer: usage, text (also passed to `on_delta`), tool-call
    fragments by index, the finish reason. Missing or null fields are absent, as the SDK's
    lenient models had them; a field of the wrong type is a MalformedChunk."""
    if not isinstance(chunk, dict):
        raise MalformedChunk(f"a stream chunk that is not an object: {str(chunk)[:200]}")
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        result.usage = _usage(usage)
    for choice in _list_of_objects(chunk.get("choices"), "choices"):
        delta = choice.get("delta")
        if delta is not None:
            if not isinstance(delta, dict):
                raise MalformedChunk("a choice's delta is not an object")
            content = delta.get("content")
            if content:
                if not isinstance(content, str):
                    raise MalformedChunk("a delta's content is not text")
                text_parts.append(content)
                if on_delta is not None:
                    on_delta(content)
            for fragment in _list_of_objects(delta.get("tool_calls"), "tool_calls"):
                index = _fragment_index(fragment, calls)
                slot = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                if fragment.get("id"):
                    slot["id"] = _text(fragment["id"], "a tool call's id")
                function = fragment.get("function")
                if function is not None:
                    if not isinstance(function, dict):
                        raise MalformedChunk("a tool call's function is not an object")
                    slot["name"] += _text(function.get("name"), "a tool call's name")
                    slot["arguments"] += _text(function.get("arguments"), "a tool call's arguments")
        finish_reason = choice.get("finish_reason")
        if finish_reason:
            result.finish_reason = _text(finish_reason, "a finish reason")


def _fragment_index(fragment: dict, calls: dict) -> int:
    """The call a tool-call fragment continues. Some OpenAI-compatible servers send whole calls
    without an `index`: then a new id starts a new call, and a fragment without one continues
    the last."""
    index = fragment.get("index")
    if isinstance(index, int) and not isinstance(index, bool):
        return index
    if index is not None:
        raise MalformedChunk("a tool call fragment's index is not an integer")
    call_id = fragment.get("id")
    for existing, slot in calls.items():
        if call_id and slot["id"] == call_id:
            return existing
    if call_id or not calls:
        return max(calls, default=-1) + 1
    return max(calls)


def _list_of_objects(value, name: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise MalformedChunk(f"a chunk's {name} is not a list of objects")
    return value


def _text(value, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedChunk(f"{what} is not text")
    return value
