"""The scripted model server, driven by the real ``openai`` client over loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from tests.support.model_server import (
    PURPOSE_HEADER,
    ScriptedModelServer,
    error_reply,
    json_reply,
    stream_event_count,
    text_reply,
    tool_call,
    tool_reply,
    truncated_reply,
)

MESSAGES = [
    {"role": "system", "content": "You are a test agent."},
    {"role": "user", "content": "Write a.txt please"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "fs_write",
            "description": "Write a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


@pytest.fixture
def server():
    with ScriptedModelServer() as srv:
        yield srv
    assert srv.live_threads() == []


def client_for(server: ScriptedModelServer, purpose: str | None = None, **kwargs) -> openai.OpenAI:
    kwargs.setdefault("max_retries", 0)
    headers = {PURPOSE_HEADER: purpose} if purpose else None
    return openai.OpenAI(base_url=server.base_url, api_key="test", default_headers=headers, **kwargs)


def stream_chunks(client: openai.OpenAI, **kwargs) -> list:
    kwargs.setdefault("messages", MESSAGES)
    with client.chat.completions.create(model="test-model", stream=True, **kwargs) as stream:
        return list(stream)


def assemble_tool_calls(chunks) -> dict[int, dict]:
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(
                    delta.index, {"id": None, "name": None, "arguments": "", "fragments": 0}
                )
                if delta.id:
                    call["id"] = delta.id
                if delta.function and delta.function.name:
                    call["name"] = delta.function.name
                if delta.function and delta.function.arguments:
                    call["arguments"] += delta.function.arguments
                    call["fragments"] += 1
    return calls


def finish_reasons(chunks) -> list[str]:
    return [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]


def test_streamed_text_assembles(server):
    text = "Hello from the scripted model. " * 4
    server.script("agent", text_reply(text, chunk_size=7))

    chunks = stream_chunks(client_for(server))

    contents = [c.delta.content for chunk in chunks for c in chunk.choices if c.delta.content]
    assert "".join(contents) == text
    assert len(contents) > 5
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1
    assert chunks[0].model == "test-model"
    assert finish_reasons(chunks) == ["stop"]
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_streamed_tool_calls_reassemble(server):
    server.script(
        "agent",
        tool_reply(
            [
                tool_call("fs_write", {"path": "a.txt", "content": "x" * 40}, id="call_1"),
                tool_call("fs_read", {"path": "notes/b.md"}, id="call_2"),
            ],
            text="Writing the file.",
        ),
    )

    chunks = stream_chunks(client_for(server), tools=TOOLS)

    calls = assemble_tool_calls(chunks)
    assert sorted(calls) == [0, 1]
    assert (calls[0]["id"], calls[0]["name"]) == ("call_1", "fs_write")
    assert (calls[1]["id"], calls[1]["name"]) == ("call_2", "fs_read")
    assert json.loads(calls[0]["arguments"]) == {"path": "a.txt", "content": "x" * 40}
    assert json.loads(calls[1]["arguments"]) == {"path": "notes/b.md"}
    assert calls[0]["fragments"] >= 2 and calls[1]["fragments"] >= 2
    text = "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices)
    assert text == "Writing the file."
    assert finish_reasons(chunks) == ["tool_calls"]

    # Each call opens with index, id, type and name and empty arguments (OpenAI's shape).
    openers = [
        d for chunk in chunks for c in chunk.choices for d in (c.delta.tool_calls or []) if d.id is not None
    ]
    assert [(d.index, d.type, d.function.arguments) for d in openers] == [
        (0, "function", ""),
        (1, "function", ""),
    ]


def test_tool_arguments_may_be_raw_malformed_text(server):
    server.script("agent", tool_reply(tool_call("fs_write", '{"path": oops', id="call_bad")))

    calls = assemble_tool_calls(stream_chunks(client_for(server)))

    assert calls[0]["arguments"] == '{"path": oops'
    with pytest.raises(json.JSONDecodeError):
        json.loads(calls[0]["arguments"])


def test_truncated_reply_has_length_and_unparsable_arguments(server):
    server.script("agent", truncated_reply("fs_write", {"path": "report.html", "content": "<html>" * 20}))
    server.script("agent", truncated_reply())

    for _ in range(2):
        chunks = stream_chunks(client_for(server))
        calls = assemble_tool_calls(chunks)
        assert finish_reasons(chunks) == ["length"]
        assert calls[0]["name"] == "fs_write"
        assert calls[0]["arguments"].startswith('{"path": "report.html"')
        with pytest.raises(json.JSONDecodeError):
            json.loads(calls[0]["arguments"])


def test_error_raises_internal_server_error(server):
    server.script("agent", error_reply(500, "upstream exploded"))

    with pytest.raises(openai.InternalServerError) as excinfo:
        stream_chunks(client_for(server))

    assert excinfo.value.status_code == 500
    assert excinfo.value.body["message"] == "upstream exploded"
    assert excinfo.value.body["type"] == "server_error"
    assert server.requests[0].status == 500
    assert server.pending() == 0


def test_error_is_consumed_and_retry_succeeds(server):
    server.script("agent", error_reply(500, "transient", times=1), text_reply("recovered"))

    chunks = stream_chunks(client_for(server, max_retries=1))

    assert "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices) == "recovered"
    first, second = server.requests
    assert (first.status, second.status) == (500, 200)
    assert (first.headers["x-stainless-retry-count"], second.headers["x-stainless-retry-count"]) == ("0", "1")
    assert first.finished_at <= second.received_at


def test_error_times_repeats_before_consumed(server):
    server.script("agent", error_reply(503, "busy", times=2), text_reply("finally"))

    with pytest.raises(openai.InternalServerError):
        stream_chunks(client_for(server, max_retries=1))
    assert [r.status for r in server.requests] == [503, 503]
    assert server.pending("agent") == 1

    completion = client_for(server).chat.completions.create(model="m", messages=MESSAGES)
    assert completion.choices[0].message.content == "finally"


def test_rate_limit_error_maps_to_client_exception(server):
    server.script("agent", error_reply(429, "slow down", code="rate_limit_exceeded"))

    with pytest.raises(openai.RateLimitError) as excinfo:
        client_for(server).chat.completions.create(model="m", messages=MESSAGES)

    assert excinfo.value.body["code"] == "rate_limit_exceeded"


def test_purposes_use_separate_queues(server):
    relation = {
        "task_relation": "new_task",
        "skill_recall_terms": ["report"],
        "tool_recall_terms": [],
        "memory_recall_terms": [],
    }
    server.script("agent", text_reply("agent answer"))
    server.script("task_relation", json_reply(relation))
    server.script("orchestrate", {"skills": ["research"], "toolsets": [], "tools": []})

    # Ask in the "wrong" order: each purpose still gets its own reply.
    orchestrate = client_for(server, "orchestrate").chat.completions.create(model="m", messages=MESSAGES)
    relation_answer = client_for(server).chat.completions.create(
        model="m", messages=MESSAGES, extra_headers={PURPOSE_HEADER: "task_relation"}
    )
    agent = client_for(server, "agent").chat.completions.create(model="m", messages=MESSAGES)

    assert json.loads(orchestrate.choices[0].message.content)["skills"] == ["research"]
    assert json.loads(relation_answer.choices[0].message.content) == relation
    assert agent.choices[0].message.content == "agent answer"
    assert [r.purpose for r in server.requests] == ["orchestrate", "task_relation", "agent"]
    assert [r.seq for r in server.requests_for("task_relation")] == [2]
    assert server.pending() == 0

    with pytest.raises(openai.InternalServerError):
        client_for(server, "summary").chat.completions.create(model="m", messages=MESSAGES)
    assert server.requests_for("summary")[0].exhausted


def test_default_and_callable_responders(server):
    def echo(request):
        return text_reply(f"echo: {request.messages[-1]['content']} ({request.purpose})")

    server.default("summary", echo)
    server.script("agent", lambda request: tool_reply(tool_call("fs_read", {"n": len(request.messages)})))
    client = client_for(server, "summary")

    for word in ("one", "two"):
        answer = client.chat.completions.create(model="m", messages=[{"role": "user", "content": word}])
        assert answer.choices[0].message.content == f"echo: {word} (summary)"

    agent = client_for(server).chat.completions.create(model="m", messages=MESSAGES)
    assert json.loads(agent.choices[0].message.tool_calls[0].function.arguments) == {"n": 2}

    server.default("summary", None)
    with pytest.raises(openai.InternalServerError, match="script exhausted"):
        client.chat.completions.create(model="m", messages=MESSAGES)


def test_responder_exception_is_a_loud_500(server):
    def broken(request):
        raise ValueError("bug in the test script")

    server.script("agent", broken)

    with pytest.raises(openai.InternalServerError, match="bug in the test script"):
        client_for(server, max_retries=2).chat.completions.create(model="m", messages=MESSAGES)
    assert len(server.requests) == 1  # x-should-retry: false
    assert "ValueError" in server.requests[0].error


def test_usage_chunk_with_include_usage(server):
    server.script("agent", text_reply("counted", usage={"prompt_tokens": 123, "completion_tokens": 7}))
    server.script("agent", text_reply("estimated"))
    server.script("agent", text_reply("no usage asked"))
    client = client_for(server)

    chunks = stream_chunks(client, stream_options={"include_usage": True})
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (123, 7)
    assert chunks[-1].usage.total_tokens == 130
    assert all(chunk.usage is None for chunk in chunks[:-1])

    chunks = stream_chunks(client, stream_options={"include_usage": True})
    assert chunks[-1].usage.prompt_tokens > 0 and chunks[-1].usage.completion_tokens > 0

    chunks = stream_chunks(client)
    assert all(chunk.usage is None for chunk in chunks)
    assert all(chunk.choices for chunk in chunks)


@pytest.mark.parametrize("include_usage", [True, False])
def test_stream_event_count_is_what_the_server_sends(server, include_usage):
    replies = [
        text_reply("a text long enough for several chunks of sixteen"),
        tool_reply(
            [tool_call("fs_write", {"path": "a.txt", "content": "x" * 40}, id="c1"), tool_call("fs_list", {})]
        ),
        text_reply(""),
    ]
    client = client_for(server)
    for reply in replies:
        server.script("agent", reply)
        stream_chunks(client, **({"stream_options": {"include_usage": True}} if include_usage else {}))
        assert server.requests[-1].wait_done(timeout=5).chunks_sent == stream_event_count(
            reply, include_usage
        )


def test_non_stream_mode(server):
    server.script("agent", text_reply("plain answer"))
    server.script(
        "agent",
        tool_reply([tool_call("fs_write", {"path": "a.txt", "content": "x"}, id="call_9")], text="Saving"),
    )
    client = client_for(server)

    first = client.chat.completions.create(model="test-model", messages=MESSAGES)
    assert first.object == "chat.completion"
    assert first.choices[0].message.content == "plain answer"
    assert first.choices[0].message.role == "assistant"
    assert first.choices[0].finish_reason == "stop"
    assert first.usage.prompt_tokens > 0 and first.usage.completion_tokens > 0

    second = client.chat.completions.create(model="test-model", messages=MESSAGES, tools=TOOLS)
    message = second.choices[0].message
    assert second.choices[0].finish_reason == "tool_calls"
    assert message.content == "Saving"
    assert [(c.id, c.type, c.function.name) for c in message.tool_calls] == [
        ("call_9", "function", "fs_write")
    ]
    assert json.loads(message.tool_calls[0].function.arguments) == {"path": "a.txt", "content": "x"}
    assert [r.stream for r in server.requests] == [False, False]


def test_finish_reason_override(server):
    server.script("agent", text_reply("filtered", finish_reason="content_filter"))

    chunks = stream_chunks(client_for(server))

    assert finish_reasons(chunks) == ["content_filter"]


def test_request_log_records_purpose_headers_and_messages(server):
    server.script("summary", json_reply({"goal": "g"}))
    server.script("agent", text_reply("ok", delay_before_s=0.05))

    client_for(server, "summary").chat.completions.create(model="m", messages=MESSAGES)
    stream_chunks(openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0), tools=TOOLS)

    summary, agent = server.requests
    assert summary.purpose == "summary"
    assert summary.headers["x-xagent-call"] == "summary"
    assert agent.purpose == "agent"  # no header -> agent
    assert "x-xagent-call" not in agent.headers
    assert all(key == key.lower() for key in agent.headers)
    assert agent.headers["authorization"] == "Bearer k"
    assert agent.body["messages"] == MESSAGES
    assert agent.messages == MESSAGES
    assert agent.tool_names == ["fs_write"]
    assert agent.stream is True and summary.stream is False
    assert "Write a.txt please" in agent.message_text()
    for rec in (summary, agent):
        assert rec.received_at <= rec.started_at <= rec.finished_at
        assert rec.status == 200 and rec.done and not rec.disconnected
    assert summary.finished_at <= agent.received_at
    assert agent.started_at - agent.received_at >= 0.04  # delay_before_s is honoured (lower bound only)
    assert [r.seq for r in server.requests] == [1, 2]


def test_script_argument_checks(server):
    with pytest.raises(TypeError):
        server.script(text_reply("forgot the purpose"))
    with pytest.raises(ValueError):
        server.script("agent")


def test_slow_stream_closed_by_client_and_server_stays_healthy(server):
    server.script("agent", text_reply("z" * 60, chunk_size=2, delay_per_chunk_s=0.2))
    server.script("agent", text_reply("next one"))
    client = client_for(server)

    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    received = [next(stream), next(stream)]
    stream.close()

    slow = server.wait_for_requests(1)[0].wait_done(timeout=5)
    assert slow.disconnected
    assert 2 <= slow.chunks_sent < 30
    assert received[1].choices[0].delta.content == "zz"

    chunks = stream_chunks(client)
    assert "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices) == "next one"
    fresh = server.requests[1]
    assert fresh.status == 200 and not fresh.disconnected
    assert slow.finished_at <= fresh.finished_at


def test_concurrent_requests_do_not_block_each_other(server):
    server.script("agent", text_reply("s" * 20, chunk_size=2, delay_per_chunk_s=0.1))
    server.script("summary", json_reply({"goal": "quick"}))
    results: dict[str, str] = {}

    def slow_consumer():
        chunks = stream_chunks(client_for(server, "agent"))
        results["agent"] = "".join(c.delta.content or "" for chunk in chunks for c in chunk.choices)

    thread = threading.Thread(target=slow_consumer)
    thread.start()
    slow = server.wait_for_requests(1, "agent")[0]
    quick = client_for(server, "summary").chat.completions.create(model="m", messages=MESSAGES)
    thread.join(timeout=10)

    assert json.loads(quick.choices[0].message.content) == {"goal": "quick"}
    assert results["agent"] == "s" * 20
    fast = server.requests_for("summary")[0]
    assert slow.received_at <= fast.received_at
    assert fast.finished_at < slow.finished_at


def test_wait_for_requests_times_out(server):
    with pytest.raises(TimeoutError, match="orchestrate"):
        server.wait_for_requests(1, "orchestrate", timeout=0.1)


def test_wait_for_requests_wakes_up_on_arrival(server):
    server.script("task_relation", text_reply("a"), text_reply("b"))

    def later():
        client = client_for(server, "task_relation")
        for _ in range(2):
            client.chat.completions.create(model="m", messages=MESSAGES)

    thread = threading.Thread(target=later)
    thread.start()
    found = server.wait_for_requests(2, purpose="task_relation", timeout=10)
    thread.join(timeout=10)

    assert [r.purpose for r in found] == ["task_relation", "task_relation"]
    assert server.requests_for("agent") == []


def test_exhausted_script_answers_500_with_clear_message(server):
    server.script("agent", text_reply("only one"))
    client = client_for(server, max_retries=3)
    client.chat.completions.create(model="m", messages=MESSAGES)

    with pytest.raises(openai.InternalServerError) as excinfo:
        stream_chunks(client)

    assert "script exhausted" in excinfo.value.message
    assert excinfo.value.body["code"] == "script_exhausted"
    assert "'agent'" in excinfo.value.body["message"]
    assert len(server.requests) == 2  # not retried: the server says x-should-retry: false
    assert server.requests[1].exhausted


def test_abort_after_chunks_drops_the_connection(server):
    server.script("agent", text_reply("partial answer that never ends", chunk_size=4, abort_after_chunks=3))
    server.script("agent", text_reply("fine again"))
    client = client_for(server)

    with pytest.raises(openai.APIConnectionError):
        stream_chunks(client)

    assert server.requests[0].chunks_sent == 3
    assert client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == (
        "fine again"
    )


def _post(url: str, data: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_malformed_request_json_is_400(server):
    server.script("agent", text_reply("untouched"))

    status, body = _post(server.base_url + "/chat/completions", b'{"model": "m", "messages": [')
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert "parse the JSON" in body["error"]["message"]

    status, body = _post(server.base_url + "/chat/completions", json.dumps({"model": "m"}).encode())
    assert status == 400
    assert "messages" in body["error"]["message"]

    assert [r.status for r in server.requests] == [400, 400]
    assert server.requests[0].body is None
    assert server.pending("agent") == 1  # bad requests consume no scripted reply


def test_models_endpoint(server):
    models = client_for(server).models.list()

    assert [m.id for m in models.data] == ["scripted-model"]
    assert server.requests == []  # only chat completions count as model calls
    assert [r.path for r in server.all_requests] == ["/v1/models"]


def test_binds_loopback_with_os_chosen_port(server):
    assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
    assert server.port > 0
    with ScriptedModelServer() as other:
        assert other.port != server.port


def test_stop_ends_in_flight_stream_promptly():
    server = ScriptedModelServer().start()
    server.script("agent", text_reply("w" * 200, chunk_size=1, delay_per_chunk_s=0.2))
    outcome: dict[str, object] = {}

    def consume():
        try:
            outcome["chunks"] = len(stream_chunks(client_for(server)))
        except openai.APIConnectionError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    rec = server.wait_for_requests(1)[0]
    deadline = time.monotonic() + 5
    while rec.chunks_sent < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rec.chunks_sent >= 2

    began = time.monotonic()
    server.stop()
    stopped_in = time.monotonic() - began

    assert server.live_threads() == []
    assert stopped_in < 2  # generous sanity bound; stop() itself joins with a 1 s budget
    assert rec.wait_done(timeout=1).chunks_sent < 200
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert "error" in outcome  # the client saw the connection end without [DONE]
    with pytest.raises(RuntimeError):
        _ = server.base_url
    server.stop()  # idempotent


def test_async_client_streams_tool_calls(server):
    server.script("agent", tool_reply(tool_call("fs_list", {"path": "."}, id="call_a"), text="Looking."))
    server.script("agent", text_reply("async done"))

    async def run():
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
        try:
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            chunks = [chunk async for chunk in stream]
            again = await client.chat.completions.create(model="m", messages=MESSAGES)
        finally:
            await client.close()
        return chunks, again

    chunks, again = asyncio.run(run())

    calls = assemble_tool_calls(chunks)
    assert (calls[0]["id"], calls[0]["name"], json.loads(calls[0]["arguments"])) == (
        "call_a",
        "fs_list",
        {"path": "."},
    )
    assert finish_reasons(chunks) == ["tool_calls"]
    assert again.choices[0].message.content == "async done"
