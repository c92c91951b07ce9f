"""Token estimate for budgeting. No tokenizer download is possible here, so this is a
character-based estimate (≈4 characters per token plus per-message overhead), kept behind
one function so a real tokenizer can replace it."""

import json


def estimate_text_tokens(text: str) -> int:
    return (len(text) + 3) // 4


def estimate_request_tokens(messages: list[dict], tools: list[dict]) -> int:
    total = 0
    for message in messages:
        total += 4 + estimate_text_tokens(message.get("content") or "")
        for call in message.get("tool_calls") or []:
            total += 4 + estimate_text_tokens(call["function"]["name"] + call["function"]["arguments"])
    if tools:
        total += estimate_text_tokens(json.dumps(tools))
    return total
