"""How a streamed answer's chunks (decoded JSON, as the SDK hands them over) become the step's
answer: text, tool calls by index, usage, finish reason, and a clear error for a chunk that is
not shaped like one. The whole path through the real client is covered by every turn the
scripted model server answers; these are the shapes it never sends."""

import pytest

from sessions_app.runtime.llm.base import ModelResult
from sessions_app.runtime.llm.openai_provider import MalformedChunk, _read_chunk


def read(*chunks):
    result, calls, text, deltas = ModelResult(), {}, [], []
    for chunk in chunks:
        _read_chunk(chunk, result, calls, text, deltas.append)
    return result, [calls[i] for i in sorted(calls)], "".join(text), deltas


def test_text_and_tool_call_fragments_join_by_index():
    result, calls, text, deltas = read(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Look"}}]},
        {"choices": [{"delta": {"content": "ing."}}]},
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "a", "function": {"name": "fs_", "arguments": '{"pa'}}
                        ]
                    }
                }
            ]
        },
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [{"index": 0, "function": {"name": "list", "arguments": 'th": "."}'}}]
                    }
                }
            ]
        },
        {
            "choices": [
                {
                    "delta": {
                        "tool_calls": [
                            {"index": 1, "id": "b", "function": {"name": "fs_read", "arguments": "{}"}}
                        ]
                    }
                }
            ]
        },
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 7}},
    )
    assert text == "Looking." and deltas == ["Look", "ing."]
    assert calls == [
        {"id": "a", "name": "fs_list", "arguments": '{"path": "."}'},
        {"id": "b", "name": "fs_read", "arguments": "{}"},
    ]
    assert result.finish_reason == "tool_calls"
    assert result.usage == {"prompt_tokens": 12, "completion_tokens": 7, "cached_tokens": 0}


def test_null_fields_are_absent():
    result, calls, text, _ = read(
        {"choices": [{"delta": {"content": None, "tool_calls": None}, "finish_reason": None}], "usage": None},
        {"choices": None},
        {"choices": [{"delta": None, "finish_reason": "stop"}]},
    )
    assert (text, calls, result.finish_reason, result.usage) == ("", [], "stop", {})


def test_whole_calls_without_an_index_each_get_their_own_slot():
    # Some OpenAI-compatible servers send each call whole, with no `index`.
    _, calls, _, _ = read(
        {"choices": [{"delta": {"tool_calls": [{"id": "a", "function": {"name": "x", "arguments": "{}"}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"id": "b", "function": {"name": "y", "arguments": "{"}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"function": {"arguments": "}"}}]}}]},
    )
    assert calls == [
        {"id": "a", "name": "x", "arguments": "{}"},
        {"id": "b", "name": "y", "arguments": "{}"},
    ]


def test_reported_usage_is_kept_within_range():
    result, *_ = read({"choices": [], "usage": {"prompt_tokens": -5, "completion_tokens": "many"}})
    assert result.usage == {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}
    cached = {"prompt_tokens": 100, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 64}}
    assert read({"choices": [], "usage": cached})[0].usage["cached_tokens"] == 64
    odd = {"prompt_tokens": 100, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": -3}}
    assert read({"choices": [], "usage": odd})[0].usage["cached_tokens"] == 0


@pytest.mark.parametrize(
    "chunk, message",
    [
        (["not", "an", "object"], "not an object"),
        ({"choices": {"0": {}}}, "choices is not a list"),
        ({"choices": [{"delta": "text"}]}, "delta is not an object"),
        ({"choices": [{"delta": {"content": 5}}]}, "content is not text"),
        ({"choices": [{"delta": {"tool_calls": [{"index": "0"}]}}]}, "index is not an integer"),
        (
            {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": "f"}]}}]},
            "function is not an object",
        ),
        (
            {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": {"a": 1}}}]}}]},
            "arguments is not text",
        ),
        ({"choices": [{"delta": {}, "finish_reason": 1}]}, "finish reason is not text"),
    ],
)
def test_a_chunk_of_the_wrong_shape_fails_with_what_was_wrong(chunk, message):
    with pytest.raises(MalformedChunk, match=message):
        read(chunk)
