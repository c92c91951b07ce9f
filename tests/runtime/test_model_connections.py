"""A worker process drives up to XAGENT_WORKER_SESSIONS Sessions at once, each holding a connection
to its model's endpoint while it streams: the one client per endpoint keeps that many alive, and a
streamed answer gives its connection back, so the next answers reuse them instead of opening (on a
real provider: handshaking) new ones."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid

import pytest

from sessions_app.runtime.llm.config import EffectiveModel
from sessions_app.runtime.llm.openai_provider import OpenAIChatProvider, client_for
from tests.support.model_server import ScriptedModelServer, text_reply

AT_ONCE = 120  # more than the SDK's default of 100 kept-alive connections


def model(base_url: str, *, guarded: bool = False) -> EffectiveModel:
    return EffectiveModel(
        provider="openai",
        name="scripted",
        model="scripted-model",
        base_url=base_url,
        api_key=f"key-{uuid.uuid4().hex}",  # a client of its own, built under this test's settings
        context_window=8000,
        max_output_tokens=100,
        temperature=None,
        guarded=guarded,
    )


def stream_all_at_once(provider: OpenAIChatProvider) -> None:
    """AT_ONCE answers streamed at the same time, as the Sessions of one worker would."""
    ready = threading.Barrier(AT_ONCE)
    errors: list[BaseException] = []

    def one():
        try:
            ready.wait(30)
            result = provider.complete([{"role": "user", "content": "hi"}], [], purpose="agent")
            assert result.text == "ok"
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(AT_ONCE)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors[:3]


def answer_once_all_arrived():
    """No answer goes out before all AT_ONCE requests are in: they are truly streaming at once,
    so none can reuse another's connection (a fixed delay did not ensure it on a loaded machine)."""
    all_arrived = threading.Barrier(AT_ONCE)

    def answer(request):
        all_arrived.wait(30)
        return text_reply("ok")

    return answer


def test_every_session_of_the_process_keeps_its_connection_between_answers(settings):
    settings.XAGENT_WORKER_SESSIONS = AT_ONCE + 30
    with ScriptedModelServer() as server:
        provider = OpenAIChatProvider(model(server.base_url))

        server.default("agent", answer_once_all_arrived())
        stream_all_at_once(provider)
        first = {request.client for request in server.requests}
        server.reset()
        server.default("agent", answer_once_all_arrived())
        stream_all_at_once(provider)
        second = {request.client for request in server.requests}

    assert len(first) == AT_ONCE  # they did stream at once, each on its own connection
    assert second <= first, f"{len(second - first)} new connections for the second answers"


@pytest.mark.parametrize("guarded", [False, True])
def test_a_tenant_endpoints_client_keeps_as_many_as_the_operators(settings, guarded):
    """Behind the outbound guard's transport httpx ignores the client's limits; the transport
    must carry them (it kept 20 of at most 100 before)."""
    settings.XAGENT_WORKER_SESSIONS = 300
    pool = client_for(model("https://models.example.test/v1", guarded=guarded))._client._transport._pool

    assert pool._max_keepalive_connections == 300
    assert pool._max_connections >= 300


class EndlessAfterDone:
    """A hostile endpoint: a proper answer, `[DONE]`, then SSE comments forever."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.base_url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"
        self.stop = threading.Event()
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        connection, _ = self.listener.accept()
        with connection:
            request = b""
            while b"\r\n\r\n" not in request:
                request += connection.recv(65536)
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
            events = [
                {**chunk, "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]},
                {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            ]
            body = b"".join(b"data: %s\n\n" % json.dumps(e).encode() for e in events) + b"data: [DONE]\n\n"
            try:
                connection.sendall(head + b"%x\r\n%s\r\n" % (len(body), body))
                while not self.stop.is_set():
                    connection.sendall(b"%x\r\n%s\r\n" % (len(b": more\n\n"), b": more\n\n"))
                    time.sleep(0.01)
            except OSError:
                pass  # the client hung up: what the test waits for


def test_an_endpoint_that_keeps_sending_after_done_does_not_hold_the_step():
    server = EndlessAfterDone()
    provider = OpenAIChatProvider(model(server.base_url))
    results: list = []
    caller = threading.Thread(
        target=lambda: results.append(
            provider.complete([{"role": "user", "content": "hi"}], [], purpose="agent")
        )
    )
    try:
        caller.start()
        caller.join(60)  # liveness only: cut off after about a second, far below this
        assert not caller.is_alive(), "the call never returned"
        assert results[0].text == "ok" and results[0].finish_reason == "stop"
    finally:
        server.stop.set()
