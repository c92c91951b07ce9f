"""The benchmark's model: answers instantly, so what is measured is the harness around it.

`ZeroLatencyModel` plugs in through the provider seam (`XAGENT_MODEL_PROVIDER=
bench.models.ZeroLatencyModel`) and serves every Session without a ModelConfig, in whichever
process runs the step: the benchmark's own, a Celery worker, the embedded stack.

Like a real model, its next move depends only on the request's messages, so it needs no state
and works across processes. The last user message may carry a directive line

    bench-directive: {"steps": 500, "plan": [[{"name": "fs_list", "arguments": {}}]]}

meaning: answer `steps` responses with tool calls (the response number i makes the calls of
`plan[i % len(plan)]`, all in one response), then a final text answer. Without a directive it
lists the workspace once and answers.

Each call is stamped (`CALL_LOG`): the time between two calls is the harness's cost of one step,
seen from the model's side, independent of how the runtime is built inside.
"""

from __future__ import annotations

import json
import uuid

from sessions_app.runtime.llm.base import ModelResult
from sessions_app.runtime.summary import STATE_KEYS as SUMMARY_KEYS

from .probe import CALL_LOG

DIRECTIVE_PREFIX = "bench-directive:"
LIST_WORKSPACE = {"name": "fs_list", "arguments": {}}
DEFAULT_DIRECTIVE = {"steps": 1, "plan": [[LIST_WORKSPACE]]}
FINAL_ANSWER = "Done: every scripted step has run."
RECALL_FIELDS = ("skill_recall_terms", "tool_recall_terms", "memory_recall_terms")


def directive_message(steps: int, plan: list[list[dict]] | None = None) -> str:
    """The user message that makes the model take `steps` tool-call steps following `plan`."""
    body = {"steps": steps, "plan": plan or [[LIST_WORKSPACE]]}
    return f"Benchmark turn.\n{DIRECTIVE_PREFIX} {json.dumps(body)}"


def next_calls(messages: list[dict]) -> list[dict]:
    """The tool calls of the next response (`[{"id", "name", "arguments"}]`); [] = answer in text.

    Progress is the number of assistant responses since the last user message: the request
    itself says how far the turn has come.
    """
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    directive = _directive(messages[last_user].get("content")) if last_user >= 0 else DEFAULT_DIRECTIVE
    done = sum(1 for m in messages[last_user + 1 :] if m.get("role") == "assistant")
    if done >= directive["steps"]:
        return []
    plan = directive["plan"]
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:12]}",
            "name": call["name"],
            "arguments": json.dumps(call["arguments"]),
        }
        for call in plan[done % len(plan)]
    ]


def _directive(content) -> dict:
    text = content if isinstance(content, str) else ""
    for line in text.splitlines():
        if line.startswith(DIRECTIVE_PREFIX):
            return json.loads(line[len(DIRECTIVE_PREFIX) :])
    return DEFAULT_DIRECTIVE


class ZeroLatencyModel:
    """A provider (see sessions_app/runtime/llm/providers.py) that answers every call at once."""

    def __init__(self, model):
        self.model = model

    def complete(self, messages, tools, *, purpose, on_delta=None, cancel=None) -> ModelResult:
        if purpose == "summary":  # a compaction (only with a small window): a valid, minimal state
            state = dict.fromkeys(SUMMARY_KEYS, "")
            state["progress"] = "earlier benchmark steps"
            return ModelResult(text=json.dumps(state), finish_reason="stop", usage=_usage([]))
        if purpose == "task_relation":  # the outer loop (sub-Sessions): a new task, its words as terms
            asked = json.loads(messages[-1]["content"])
            words = [w for w in dict.fromkeys(asked["message"].lower().split()) if w.isalpha()][:8]
            answer = {"task_relation": "new_task", **dict.fromkeys(RECALL_FIELDS, words)}
            return ModelResult(text=json.dumps(answer), finish_reason="stop", usage=_usage([]))
        if purpose == "orchestrate":  # the best-ranked candidate Skill and tool set
            candidates = json.loads(messages[-1]["content"])["candidates"]
            answer = {kind: [c["name"] for c in candidates[kind][:1]] for kind in ("skills", "toolsets")}
            return ModelResult(
                text=json.dumps({**answer, "tools": []}), finish_reason="stop", usage=_usage([])
            )
        CALL_LOG.stamp()
        calls = next_calls(messages)
        if calls:
            return ModelResult(tool_calls=calls, finish_reason="tool_calls", usage=_usage(calls))
        return ModelResult(text=FINAL_ANSWER, finish_reason="stop", usage=_usage([]))


def _usage(calls: list[dict]) -> dict:
    # A token count in the usual 4-characters rule, so evidence rows look like a real model's.
    output = FINAL_ANSWER if not calls else "".join(c["arguments"] for c in calls)
    return {"prompt_tokens": 0, "completion_tokens": (len(output) + 3) // 4}


# The dotted path Sessions record as their model's provider (`ModelCall.provider`, 20 characters,
# which PostgreSQL enforces): `bench.models.ZeroLatencyModel` would not fit.
Zero = ZeroLatencyModel
