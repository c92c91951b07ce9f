"""What a tool is to ToolService: a name, a JSON schema, a risk level and a `run`.

Tools never import sessions_app (ARCHITECTURE §10): facts they change on the Session
(plan, task completion, files) go through the `SessionPort` the runtime hands over in
the `ToolContext`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from approvals_app.choices import Risk


class ToolError(Exception):
    """A refusal or failure the model should see as the tool's result (never a crash of the loop).

    `stage` names the governance stage that refused (resolve, validate, runtime, ...).
    """

    def __init__(self, message: str, *, code: str = "tool_error", stage: str = "runtime"):
        super().__init__(message)
        self.code = code
        self.stage = stage


class SessionPort(Protocol):
    """The narrow set of Session operations a tool may call (implemented by the runtime)."""

    def plan_create(self, title: str, tasks: list[str]) -> dict: ...

    def plan_update(self, updates: list[dict]) -> dict: ...

    def task_complete(self, task_id: str, summary: str) -> dict: ...

    def file_changed(self, path: str, op: str) -> None: ...

    def capabilities(self) -> dict: ...

    def goal_claim(self, status: str, reason: str) -> dict:
        """During a goal run's round: the agent's claim (`complete` / `blocked`) as recorded."""

    def add_capabilities(self, tools: list[str], toolsets: list[str]) -> dict: ...

    def load_skills(self, refs: list[str]) -> dict: ...

    def loaded_skill_names(self) -> list[str]: ...

    def memory_save(self, text: str, kind: str) -> dict: ...

    def memory_search(self, query: str, kind: str | None, limit: int) -> list[dict]: ...

    def delegate(self, *, request: str, files: list[str], session_id, title: str, call_id: str) -> dict: ...

    # A question for a person in the middle of a call (MCP elicitation): committed as a pending
    # input request, answered elsewhere (maybe another process), so the tool polls for it.
    def request_input(
        self, *, call_id: str, server: str, tool: str, message: str, schema: dict, timeout_seconds: float
    ) -> int: ...

    def input_answer(self, request_id: int) -> dict | None:
        """`{"status", "action", "content"}` once answered (or expired/cancelled); None while pending."""

    def close_input(self, request_id: int, *, expired: bool) -> dict:
        """Nobody answered in time (`expired`) or the turn is interrupted: close it; returns the
        final answer (a person's, if theirs got there first)."""

    def interrupted(self) -> bool:
        """True once the person interrupted the turn: a tool waiting on them stops waiting."""


@dataclass
class ToolContext:
    session_id: str
    tenant_id: int
    workspace: Path
    port: SessionPort
    call_id: str = ""
    # shell_exec's environment as admins bound it (tool sets' shell environments, secrets
    # resolved): the one way a secret reaches a process. Never from the model's arguments.
    env: dict[str, str] = field(default_factory=dict)
    # Why that environment could not be built (a secret a tool set names is not set): shell_exec
    # refuses to run rather than run without it.
    env_problem: str = ""
    sandbox_limits: Any = None
    # Set when the turn is interrupted or its step is stopped (a threading.Event): a sandboxed
    # command is killed at once instead of running out its wall clock.
    cancel: Any = None


@dataclass
class ToolResult:
    """`content` is what the model reads; `summary` a one-line description for tool cards."""

    content: str
    summary: str = ""
    is_error: bool = False
    data: dict[str, Any] = field(default_factory=dict)
    # The code the model sees with an error result (CONTRACT: e.g. `quota_exceeded`).
    error_code: str = "tool_error"


class Tool:
    name: str = ""
    description: str = ""
    input_schema: dict = {"type": "object", "properties": {}}
    risk: Risk = Risk.READ
    read_only: bool = False
    idempotent: bool = False

    def precheck(self, ctx: ToolContext, args: dict) -> None:
        """Refuse (raise ToolError) what is known not to run before approval is asked, so nobody
        is asked to approve a call that would be refused anyway. Most tools have nothing here."""

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:  # pragma: no cover - interface
        raise NotImplementedError

    def openai_schema(self) -> dict:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.input_schema},
        }
