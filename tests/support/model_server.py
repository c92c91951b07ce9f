"""A scripted OpenAI-compatible HTTP server for integration tests.

It is the only stand-in for a real model: the product's real ``openai`` client talks to it
over loopback HTTP (Chat Completions, streaming and tool calls included). Replies are
queued per *purpose*, read from the request header ``X-XAgent-Call`` (``agent``,
``task_relation``, ``orchestrate``, ``summary``; missing -> ``agent``)::

    with ScriptedModelServer() as server:
        server.script("agent", tool_reply([tool_call("fs_write", {"path": "a.txt"})]))
        server.script("agent", text_reply("done"))
        server.default("task_relation", json_reply({"task_relation": "new_task", ...}))
        client = openai.OpenAI(base_url=server.base_url, api_key="test")
        ...
        first = server.wait_for_requests(1)[0]

Stdlib only (no Django), so it can run inside any test process.
"""

from __future__ import annotations

import contextlib
import json
import math
import select
import socket
import socketserver
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "PURPOSE_HEADER",
    "PURPOSES",
    "DEFAULT_PURPOSE",
    "ErrorReply",
    "RecordedRequest",
    "Reply",
    "ScriptedModelServer",
    "ToolCall",
    "error_reply",
    "json_content",
    "json_reply",
    "text_reply",
    "tool_call",
    "tool_reply",
    "truncated_reply",
]

PURPOSE_HEADER = "X-XAgent-Call"
PURPOSES = ("agent", "task_relation", "orchestrate", "summary")
DEFAULT_PURPOSE = "agent"
CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
MODELS_PATHS = ("/v1/models", "/models")

_STOP_SLICE_S = 0.05  # granularity of interruptible sleeps (stop / client disconnect)


# --------------------------------------------------------------------------- replies


@dataclass
class ToolCall:
    """One function call the model asks for. ``arguments`` as a dict/list is JSON-encoded;
    a ``str`` is sent verbatim (so malformed JSON can be scripted)."""

    name: str
    arguments: Any = field(default_factory=dict)
    id: str | None = None

    def arguments_text(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class Reply:
    """A successful completion: optional text, then optional tool calls.

    Options: ``finish_reason`` (default ``tool_calls`` when there are tool calls, else
    ``stop``), ``usage`` (dict with ``prompt_tokens``/``completion_tokens``, or a callable
    ``fn(request) -> dict``; missing values are estimated from lengths), ``delay_before_s``
    (before the first byte), ``delay_per_chunk_s`` (between stream chunks),
    ``chunk_size`` (characters per content delta), ``args_chunk_size`` (characters per
    arguments fragment; always at least two fragments), ``abort_after_chunks`` (drop the
    connection after that many SSE events, without ``[DONE]``), ``times`` (how many
    requests this scripted reply answers before it is consumed), ``headers`` (extra
    response headers)."""

    text: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, int] | Callable[[RecordedRequest], dict[str, int]] | None = None
    delay_before_s: float = 0.0
    delay_per_chunk_s: float = 0.0
    chunk_size: int = 16
    args_chunk_size: int = 12
    abort_after_chunks: int | None = None
    times: int = 1
    headers: dict[str, str] = field(default_factory=dict)

    def effective_finish_reason(self) -> str:
        if self.finish_reason:
            return self.finish_reason
        return "tool_calls" if self.tool_calls else "stop"


@dataclass
class ErrorReply:
    """An HTTP error with an OpenAI-style body ``{"error": {"message", "type", "param",
    "code"}}``. ``retry_after_s`` sets ``retry-after-ms`` (keeps client retries fast;
    ``None`` omits it); ``should_retry`` sets ``x-should-retry`` when not ``None``."""

    status: int = 500
    message: str = "The scripted model server returned an error."
    type: str | None = None
    code: str | None = None
    times: int = 1
    delay_before_s: float = 0.0
    retry_after_s: float | None = 0.01
    should_retry: bool | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return _error_body(self.status, self.message, self.type, self.code)


AnyReply = Reply | ErrorReply
Responder = Reply | ErrorReply | str | dict | Callable[["RecordedRequest"], Any]


def tool_call(name: str, arguments: Any = None, *, id: str | None = None) -> ToolCall:
    """A tool call; ``arguments`` dict -> JSON, ``str`` -> sent verbatim."""
    return ToolCall(name=name, arguments={} if arguments is None else arguments, id=id)


def text_reply(text: str, *, chunk_size: int = 16, **options: Any) -> Reply:
    """A plain assistant message (``finish_reason: stop`` unless overridden)."""
    return Reply(text=text, chunk_size=chunk_size, **options)


def tool_reply(calls: list[ToolCall] | ToolCall, text: str | None = None, **options: Any) -> Reply:
    """Tool calls (optionally preceded by text); ``finish_reason: tool_calls``."""
    if isinstance(calls, ToolCall):
        calls = [calls]
    return Reply(text=text, tool_calls=list(calls), **options)


def json_content(obj: Any) -> str:
    """The JSON text a purpose such as ``task_relation`` expects as message content."""
    return json.dumps(obj, ensure_ascii=False)


def json_reply(obj: Any, **options: Any) -> Reply:
    """A text reply whose content is ``obj`` as JSON."""
    return text_reply(json_content(obj), **options)


_DEFAULT_TRUNCATED_ARGS = {
    "path": "report.html",
    "content": "<!doctype html><html><head><title>Weekly report</title></head><body><h1>KPIs</h1>",
}


def truncated_reply(
    name: str = "fs_write",
    arguments: Any = None,
    *,
    cut: float = 0.5,
    text: str | None = None,
    id: str | None = None,
    **options: Any,
) -> Reply:
    """Output cut by the token limit: ``finish_reason: length`` and a half-written tool call.

    ``arguments`` (dict or str; a default fs_write payload if omitted) is JSON-encoded and
    cut to the fraction ``cut`` of its length, so it never parses. A ``str`` given with
    ``cut=1`` is sent verbatim."""
    full = ToolCall(name, _DEFAULT_TRUNCATED_ARGS if arguments is None else arguments).arguments_text()
    if cut < 1:
        keep = max(1, min(len(full) - 1, int(len(full) * cut)))
        full = full[:keep]
    options.setdefault("finish_reason", "length")
    return Reply(text=text, tool_calls=[ToolCall(name, full, id=id)], **options)


def error_reply(
    status: int = 500,
    message: str = "The scripted model server returned an error.",
    *,
    times: int = 1,
    type: str | None = None,
    code: str | None = None,
    **options: Any,
) -> ErrorReply:
    """An HTTP error answered ``times`` times before it is consumed."""
    return ErrorReply(status=status, message=message, times=times, type=type, code=code, **options)


def _default_error_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        408: "timeout_error",
        409: "conflict_error",
        422: "invalid_request_error",
        429: "rate_limit_error",
    }.get(status, "server_error" if status >= 500 else "invalid_request_error")


def _error_body(status: int, message: str, type_: str | None = None, code: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": type_ or _default_error_type(status),
            "param": None,
            "code": code,
        }
    }


# --------------------------------------------------------------------------- request log


@dataclass
class RecordedRequest:
    """One request as the server saw it. ``body`` is the parsed JSON (``None`` if it did
    not parse). ``started_at``/``finished_at`` bracket the response (first byte / just
    before the last write, or the abort), so a client that has the whole response always
    sees a finished record; ``disconnected`` is set when the client went away mid-response;
    ``exhausted`` when no scripted reply was left (the 500 "script exhausted")."""

    seq: int
    method: str
    path: str
    purpose: str
    headers: dict[str, str]
    body: Any
    raw_body: bytes
    received_at: float
    client: tuple | None = None  # (host, port) of the connection it came on
    started_at: float | None = None
    finished_at: float | None = None
    status: int | None = None
    stream: bool = False
    reply: Any = None
    chunks_sent: int = 0
    disconnected: bool = False
    exhausted: bool = False
    error: str | None = None
    _done: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    @property
    def messages(self) -> list[dict[str, Any]]:
        if isinstance(self.body, dict) and isinstance(self.body.get("messages"), list):
            return self.body["messages"]
        return []

    @property
    def tools(self) -> list[dict[str, Any]]:
        if isinstance(self.body, dict) and isinstance(self.body.get("tools"), list):
            return self.body["tools"]
        return []

    @property
    def tool_names(self) -> list[str]:
        return [t.get("function", {}).get("name") for t in self.tools if isinstance(t, dict)]

    @property
    def model(self) -> str | None:
        return self.body.get("model") if isinstance(self.body, dict) else None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait_done(self, timeout: float = 10) -> RecordedRequest:
        """Block until the response finished (or was aborted); TimeoutError otherwise."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"response to request #{self.seq} ({self.purpose}) not finished in {timeout}s")
        return self

    def message_text(self) -> str:
        """All message contents joined by newlines (text parts of list contents too)."""
        parts: list[str] = []
        for msg in self.messages:
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):
                parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
        return "\n".join(parts)


# --------------------------------------------------------------------------- server


class _ClientGone(Exception):
    """The client closed the connection, or the server is stopping."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False
    request_queue_size = 128

    def __init__(self, owner: ScriptedModelServer) -> None:
        self.owner = owner
        self.thread_prefix = owner._thread_prefix
        self._conn_lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._conn_threads: set[threading.Thread] = set()
        super().__init__(("127.0.0.1", 0), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls getfqdn(), which may hit DNS; not needed here.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def process_request(self, request, client_address) -> None:
        thread = threading.Thread(
            target=self._serve_connection,
            args=(request, client_address),
            name=f"{self.thread_prefix}-conn",
            daemon=True,
        )
        with self._conn_lock:
            self._connections.add(request)
            self._conn_threads.add(thread)
        thread.start()

    def _serve_connection(self, request, client_address) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            pass
        finally:
            with self._conn_lock:
                self._connections.discard(request)
                self._conn_threads.discard(threading.current_thread())
            self.shutdown_request(request)

    def abort_connections(self, join_timeout: float) -> None:
        with self._conn_lock:
            conns = list(self._connections)
            threads = list(self._conn_threads)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + join_timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def handle_error(self, request, client_address) -> None:
        pass  # connection-level noise (resets) is expected in tests


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "ScriptedModelServer/1.0"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # ---- plumbing -------------------------------------------------------------------

    @property
    def owner(self) -> ScriptedModelServer:
        return self.server.owner

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            data = bytearray()
            while True:
                size_line = self.rfile.readline()
                size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(data)
                data += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/") or "/"

    def _send_json(
        self,
        rec: RecordedRequest,
        status: int,
        payload: Any,
        extra_headers: dict[str, str] | None = None,
    ) -> None:
        data = json.dumps(payload).encode()
        rec.started_at = time.time()
        rec.status = status
        # Final before the client can see the response, so tests never race the log.
        self.owner._finish(rec)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-request-id", f"req_{uuid.uuid4().hex[:24]}")
        for key, value in (extra_headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _client_gone(self) -> bool:
        """True if the peer closed the connection (readable with EOF)."""
        try:
            # poll(), not select(): select() fails for descriptors >= 1024 (busy test processes).
            poller = select.poll()
            poller.register(self.connection, select.POLLIN | select.POLLHUP | select.POLLERR)
            if not poller.poll(0):
                return False
            return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def _pause(self, seconds: float) -> None:
        """Sleep, but give up promptly when the server stops or the client goes away."""
        stop = self.owner._stop_event
        deadline = time.monotonic() + max(0.0, seconds)
        while True:
            if stop.is_set() or self._client_gone():
                raise _ClientGone()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._wait_readable(remaining)

    def _wait_readable(self, seconds: float) -> None:
        """Block until the connection turns readable (the client hung up, or the server's
        `stop` shut the socket down) or `seconds` pass: one wake-up per pause, not one every
        _STOP_SLICE_S — hundreds of streams in flight (bench slow_model) otherwise cost the
        machine a good part of a core in polling."""
        try:
            poller = select.poll()
            poller.register(self.connection, select.POLLIN | select.POLLHUP | select.POLLERR)
            woken = poller.poll(max(1, math.ceil(seconds * 1000)))
        except OSError:
            return  # `_client_gone` says so on the next pass
        if woken and not self._client_gone():
            # Readable but still there (the client sent more bytes): sleep in slices instead,
            # or this would spin.
            self.owner._stop_event.wait(min(seconds, _STOP_SLICE_S))

    # ---- verbs ----------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802
        path = self._path()
        rec = self.owner._record(self, b"", None, chat=False)
        if path in MODELS_PATHS:
            payload = {
                "object": "list",
                "data": [
                    {
                        "id": self.owner.model,
                        "object": "model",
                        "created": int(self.owner._created),
                        "owned_by": "xagent-tests",
                    }
                ],
            }
            self._finish_simple(rec, 200, payload)
        else:
            self._finish_simple(rec, 404, _error_body(404, f"Unknown path {path!r}", code="not_found"))

    def do_POST(self) -> None:  # noqa: N802
        path = self._path()
        raw = self._read_body()
        if path not in CHAT_PATHS:
            rec = self.owner._record(self, raw, None, chat=False)
            self._finish_simple(rec, 404, _error_body(404, f"Unknown path {path!r}", code="not_found"))
            return
        body: Any = None
        problem = None
        try:
            body = json.loads(raw.decode("utf-8")) if raw else None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            problem = f"We could not parse the JSON body of your request. ({exc})"
        if problem is None:
            if not isinstance(body, dict):
                problem = "The request body must be a JSON object."
            elif not isinstance(body.get("messages"), list):
                problem = "Missing required parameter: 'messages' (an array)."
            elif not isinstance(body.get("model"), str) or not body.get("model"):
                problem = "Missing required parameter: 'model'."
        rec = self.owner._record(self, raw, body, chat=True)
        if problem is not None:
            rec.error = problem
            self._finish_simple(rec, 400, _error_body(400, problem, code="invalid_request"))
            return
        rec.stream = bool(body.get("stream"))
        reply = self.owner._next_reply(rec)
        rec.reply = reply
        try:
            if isinstance(reply, ErrorReply):
                self._send_error_reply(rec, reply)
            elif rec.stream:
                self._send_stream(rec, reply)
            else:
                self._send_completion(rec, reply)
        except (_ClientGone, OSError):
            rec.disconnected = rec.disconnected or not self.owner._stop_event.is_set()
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        finally:
            self.owner._finish(rec)

    def _finish_simple(self, rec: RecordedRequest, status: int, payload: Any) -> None:
        try:
            self._send_json(rec, status, payload)
        except OSError:
            rec.disconnected = True
            self.close_connection = True
        finally:
            self.owner._finish(rec)

    # ---- responses ------------------------------------------------------------------

    def _send_error_reply(self, rec: RecordedRequest, reply: ErrorReply) -> None:
        self._pause(reply.delay_before_s)
        headers = dict(reply.headers)
        if reply.retry_after_s is not None:
            headers.setdefault("retry-after-ms", str(max(1, int(round(reply.retry_after_s * 1000)))))
        if reply.should_retry is not None:
            headers.setdefault("x-should-retry", "true" if reply.should_retry else "false")
        self._send_json(rec, reply.status, reply.body(), headers)

    def _send_completion(self, rec: RecordedRequest, reply: Reply) -> None:
        self._pause(reply.delay_before_s)
        message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None}
        calls = _resolved_calls(reply)
        if calls:
            message["tool_calls"] = [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments_text()},
                }
                for call_id, call in calls
            ]
        payload = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": rec.model,
            "system_fingerprint": "fp_scripted",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": reply.effective_finish_reason(),
                }
            ],
            "usage": _usage(reply, rec),
        }
        self._send_json(rec, 200, payload, reply.headers)

    def _send_stream(self, rec: RecordedRequest, reply: Reply) -> None:
        self._pause(reply.delay_before_s)
        include_usage = bool((rec.body.get("stream_options") or {}).get("include_usage"))
        events = list(_stream_events(reply, rec, include_usage))
        rec.started_at = time.time()
        rec.status = 200
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("x-request-id", f"req_{uuid.uuid4().hex[:24]}")
        for key, value in reply.headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.flush()
        last = len(events) - 1
        for i, event in enumerate(events):
            if reply.abort_after_chunks is not None and i >= reply.abort_after_chunks:
                # Simulate a dropped upstream connection: no [DONE], no terminating chunk.
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            if i > 0 and reply.delay_per_chunk_s > 0:
                self._pause(reply.delay_per_chunk_s)
            elif self.owner._stop_event.is_set():
                raise _ClientGone()
            if i == last:
                # [DONE] and the terminating chunk go out in one write, after the record is
                # final: once the client has seen [DONE], the log already shows it finished.
                rec.chunks_sent += 1
                self.owner._finish(rec)
                self._write_chunk(event, terminate=True)
            else:
                self._write_chunk(event)
                rec.chunks_sent += 1

    def _write_chunk(self, data: bytes, *, terminate: bool = False) -> None:
        self.wfile.write(b"%x\r\n%s\r\n%s" % (len(data), data, b"0\r\n\r\n" if terminate else b""))
        self.wfile.flush()


def _resolved_calls(reply: Reply) -> list[tuple[str, ToolCall]]:
    return [(call.id or f"call_{uuid.uuid4().hex[:24]}", call) for call in reply.tool_calls]


def _estimate_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4))


def _usage(reply: Reply, rec: RecordedRequest) -> dict[str, Any]:
    given = reply.usage(rec) if callable(reply.usage) else (reply.usage or {})
    prompt = given.get("prompt_tokens")
    if prompt is None:
        prompt_src = json.dumps(rec.messages, ensure_ascii=False) + json.dumps(rec.tools, ensure_ascii=False)
        prompt = _estimate_tokens(prompt_src)
    completion = given.get("completion_tokens")
    if completion is None:
        out = (reply.text or "") + "".join(c.name + c.arguments_text() for c in reply.tool_calls)
        completion = _estimate_tokens(out)
    usage: dict[str, Any] = {
        "prompt_tokens": int(prompt),
        "completion_tokens": int(completion),
        "total_tokens": int(given.get("total_tokens", prompt + completion)),
    }
    for extra in ("prompt_tokens_details", "completion_tokens_details"):
        if extra in given:
            usage[extra] = given[extra]
    return usage


def _split(text: str, size: int, *, min_parts: int = 1) -> list[str]:
    if not text:
        return []
    size = max(1, size)
    if min_parts > 1 and len(text) >= min_parts:
        size = min(size, math.ceil(len(text) / min_parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def stream_event_count(reply: Reply, include_usage: bool) -> int:
    """How many SSE events `_stream_events` sends for `reply` ([DONE] included), without
    building them: a caller pacing a stream over a fixed time (bench slow_model) needs the count
    before the first event, and building every event twice costs the shared machine CPU."""
    calls = sum(
        1 + len(_split(call.arguments_text(), reply.args_chunk_size, min_parts=2))
        for call in reply.tool_calls
    )
    text_parts = len(_split(reply.text or "", reply.chunk_size))
    return 1 + text_parts + calls + 1 + (1 if include_usage else 0) + 1


def _stream_events(reply: Reply, rec: RecordedRequest, include_usage: bool) -> Iterator[bytes]:
    """SSE events shaped like OpenAI's Chat Completions stream."""
    completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    created = int(time.time())
    model = rec.model

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        payload: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_scripted",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if include_usage:
            payload["usage"] = None
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    calls = _resolved_calls(reply)
    text_parts = _split(reply.text or "", reply.chunk_size)
    # Like OpenAI: the first delta carries the role (content "" for text, null for tool-only).
    yield chunk({"role": "assistant", "content": "" if (text_parts or not calls) else None, "refusal": None})
    for part in text_parts:
        yield chunk({"content": part})
    for index, (call_id, call) in enumerate(calls):
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                ]
            }
        )
        for fragment in _split(call.arguments_text(), reply.args_chunk_size, min_parts=2):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
    yield chunk({}, reply.effective_finish_reason())
    if include_usage:
        usage_payload = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_scripted",
            "choices": [],
            "usage": _usage(reply, rec),
        }
        yield b"data: " + json.dumps(usage_payload).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


@dataclass
class _Entry:
    responder: Any
    remaining: int


class ScriptedModelServer:
    """Scripted OpenAI-compatible server on ``127.0.0.1`` (OS-chosen port).

    Use as a context manager or call ``start()``/``stop()``. Each request to
    ``POST /v1/chat/completions`` takes the next scripted reply of its purpose (header
    ``X-XAgent-Call``, default ``agent``); when the queue is empty the purpose's default
    answers, and without a default the server answers 500 "script exhausted" (with
    ``x-should-retry: false``) so tests fail loudly."""

    def __init__(self, *, model: str = "scripted-model") -> None:
        self.model = model
        self._created = time.time()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queues: dict[str, deque[_Entry]] = {}
        self._defaults: dict[str, Any] = {}
        self._log: list[RecordedRequest] = []
        self._seq = 0
        self._stop_event = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._thread_prefix = f"scripted-model-{uuid.uuid4().hex[:8]}"

    # ---- lifecycle ------------------------------------------------------------------

    def start(self) -> ScriptedModelServer:
        if self._httpd is not None:
            return self
        self._stop_event.clear()
        self._httpd = _HTTPServer(self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{self._thread_prefix}-serve",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving: close the listening socket and abort in-flight responses. Waits up to
        `timeout` for the connection threads (they end as soon as they run again: on a loaded
        machine that took longer than 1 s, and a teardown check saw one still alive)."""
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._stop_event.set()
        httpd.shutdown()
        httpd.server_close()
        httpd.abort_connections(join_timeout=timeout)
        if thread is not None:
            thread.join(timeout)
        self._httpd = None
        self._thread = None
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._httpd is not None

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("ScriptedModelServer is not running; call start() first")
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def live_threads(self) -> list[threading.Thread]:
        """This server's threads still alive (serving loop and connections); empty after a
        clean stop()."""
        return [t for t in threading.enumerate() if t.name.startswith(self._thread_prefix)]

    # ---- scripting ------------------------------------------------------------------

    def script(self, purpose: str = DEFAULT_PURPOSE, *responses: Responder) -> ScriptedModelServer:
        """Append replies to ``purpose``'s queue. A reply is a ``Reply``/``ErrorReply``, a
        ``str`` (text reply), a ``dict`` (JSON reply) or ``fn(request) -> reply``."""
        if not isinstance(purpose, str):
            raise TypeError(
                "script(purpose, *responses): the first argument is the purpose "
                f"(e.g. 'agent'), got {type(purpose).__name__}"
            )
        if not responses:
            raise ValueError(f"script({purpose!r}) needs at least one response")
        entries = []
        for responder in responses:
            _check_responder(responder)
            times = getattr(responder, "times", 1) if not callable(responder) else 1
            if times < 1:
                raise ValueError("times must be >= 1")
            entries.append(_Entry(responder, times))
        with self._lock:
            self._queues.setdefault(_norm_purpose(purpose), deque()).extend(entries)
        return self

    def default(self, purpose: str, response_or_callable: Responder | None) -> ScriptedModelServer:
        """What ``purpose`` answers when its queue is empty (reused every time);
        ``None`` restores the 500 "script exhausted" answer."""
        with self._lock:
            if response_or_callable is None:
                self._defaults.pop(_norm_purpose(purpose), None)
            else:
                _check_responder(response_or_callable)
                self._defaults[_norm_purpose(purpose)] = response_or_callable
        return self

    def pending(self, purpose: str | None = None) -> int:
        """Scripted replies not consumed yet (for one purpose, or all)."""
        with self._lock:
            queues = self._queues.values() if purpose is None else [self._queues.get(purpose, deque())]
            return sum(entry.remaining for queue in queues for entry in queue)

    def reset(self) -> None:
        """Forget queues, defaults and the request log."""
        with self._lock:
            self._queues.clear()
            self._defaults.clear()
            self._log.clear()

    # ---- request log ----------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Chat-completion requests in arrival order (a copy of the list)."""
        with self._lock:
            return [r for r in self._log if r.path in CHAT_PATHS]

    @property
    def all_requests(self) -> list[RecordedRequest]:
        """Every request, including ``/v1/models`` and unknown paths."""
        with self._lock:
            return list(self._log)

    def requests_for(self, purpose: str) -> list[RecordedRequest]:
        purpose = _norm_purpose(purpose)
        with self._lock:
            return [r for r in self._log if r.path in CHAT_PATHS and r.purpose == purpose]

    def wait_for_requests(
        self, n: int, purpose: str | None = DEFAULT_PURPOSE, timeout: float = 10
    ) -> list[RecordedRequest]:
        """Block until at least ``n`` chat requests of ``purpose`` (``None``: any) arrived;
        returns them all. Raises TimeoutError otherwise."""
        wanted = None if purpose is None else _norm_purpose(purpose)

        def matching() -> list[RecordedRequest]:
            return [r for r in self._log if r.path in CHAT_PATHS and (wanted is None or r.purpose == wanted)]

        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = matching()
                if len(found) >= n:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    seen = [(r.seq, r.purpose) for r in self._log if r.path in CHAT_PATHS]
                    raise TimeoutError(
                        f"waited {timeout}s for {n} request(s) of purpose {purpose!r}, "
                        f"got {len(found)}; all chat requests so far: {seen}"
                    )
                self._cond.wait(remaining)

    # ---- internals (called from handler threads) ------------------------------------

    def _record(self, handler: _Handler, raw: bytes, body: Any, *, chat: bool) -> RecordedRequest:
        headers = {k.lower(): v for k, v in handler.headers.items()}
        purpose = _norm_purpose(headers.get(PURPOSE_HEADER.lower()) or DEFAULT_PURPOSE)
        with self._cond:
            self._seq += 1
            rec = RecordedRequest(
                seq=self._seq,
                method=handler.command,
                path=handler._path(),
                purpose=purpose,
                headers=headers,
                body=body,
                raw_body=raw,
                received_at=time.time(),
                client=tuple(handler.client_address),
            )
            self._log.append(rec)
            self._cond.notify_all()
        return rec

    def _finish(self, rec: RecordedRequest) -> None:
        if rec.finished_at is None:
            rec.finished_at = time.time()
        rec._done.set()
        with self._cond:
            self._cond.notify_all()

    def _next_reply(self, rec: RecordedRequest) -> AnyReply:
        with self._lock:
            queue = self._queues.get(rec.purpose)
            responder = None
            if queue:
                entry = queue[0]
                entry.remaining -= 1
                if entry.remaining <= 0:
                    queue.popleft()
                responder = entry.responder
            elif rec.purpose in self._defaults:
                responder = self._defaults[rec.purpose]
        if responder is None:
            rec.exhausted = True
            rec.error = "script exhausted"
            return ErrorReply(
                status=500,
                message=(
                    f"ScriptedModelServer: script exhausted for purpose {rec.purpose!r} "
                    f"(request #{rec.seq}); queue replies with server.script({rec.purpose!r}, ...) "
                    f"or set server.default({rec.purpose!r}, ...)"
                ),
                type="script_exhausted",
                code="script_exhausted",
                retry_after_s=None,
                should_retry=False,
            )
        try:
            return _coerce(responder(rec) if _is_callable_responder(responder) else responder)
        except Exception as exc:
            rec.error = "".join(traceback.format_exception(exc))
            return ErrorReply(
                status=500,
                message=f"ScriptedModelServer: responder for {rec.purpose!r} raised {exc!r}",
                type="responder_error",
                code="responder_error",
                retry_after_s=None,
                should_retry=False,
            )


def _norm_purpose(purpose: str) -> str:
    return purpose.strip().lower()


def _is_callable_responder(responder: Any) -> bool:
    return callable(responder) and not isinstance(responder, (Reply, ErrorReply, str, dict))


def _check_responder(responder: Any) -> None:
    if not (isinstance(responder, (Reply, ErrorReply, str, dict)) or callable(responder)):
        raise TypeError(f"not a reply or callable: {responder!r}")


def _coerce(result: Any) -> AnyReply:
    if isinstance(result, (Reply, ErrorReply)):
        return result
    if isinstance(result, str):
        return text_reply(result)
    if isinstance(result, dict):
        return json_reply(result)
    raise TypeError(f"responder returned {type(result).__name__}, expected Reply/ErrorReply/str/dict")
