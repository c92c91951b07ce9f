"""Token estimate for budgeting. No tokenizer download is possible here, so this is a
character-based estimate (≈4 characters per token plus per-message overhead), kept behind
one function so a real tokenizer can replace it."""

import json


def estimate_text_tokens(text: str) -> int:
    return (len(text) + 3) // 4


def estimate_message_tokens(wire: dict) -> int:
    """One wire message's estimate: made once, when the message is committed."""
    total = 4 + estimate_text_tokens(wire.get("content") or "")
    for call in wire.get("tool_calls") or []:
        total += 4 + estimate_text_tokens(call["function"]["name"] + call["function"]["arguments"])
    return total


def estimate_tools_tokens(tools: list[dict]) -> int:
    return estimate_text_tokens(json.dumps(tools)) if tools else 0
