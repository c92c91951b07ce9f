"""The scenarios, in report order. Each module's `run(options) -> {"figures": [...], "details": {...}}`
runs inside a child process (bench.child) with Django set up for the database under test.

The registry names modules instead of importing them, so the parent never needs Django.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    module: str
    # Why it cannot run on SQLite (embedded mode), if it cannot.
    sqlite_skip: str = ""

    def run(self, options: dict) -> dict:
        return import_module(f"{__name__}.{self.module}").run(options)


SCENARIOS = {
    scenario.name: scenario
    for scenario in (
        Scenario(
            "steps", "1. Step overhead, in-process zero-latency model, one turn of N steps", "step_overhead"
        ),
        Scenario(
            "openai", "2. Step overhead through the openai client (loopback scripted server)", "openai_client"
        ),
        Scenario("events", "3. Commit → WebSocket client event latency (daphne + worker)", "event_latency"),
        Scenario(
            "load",
            "4. 200 Sessions × 20 steps on 2 worker processes",
            "load",
            sqlite_skip="needs worker processes (PostgreSQL + Redis)",
        ),
        Scenario(
            "approvals", "5. Approval decide → original tool ran (REST decide, real stack)", "approvals"
        ),
        Scenario(
            "parallel", "6. Four read-only tool calls in one step: parallel vs serial", "parallel_tools"
        ),
        Scenario(
            "compaction", "7. A 300-step turn in an 8,000-token window: budget and compaction", "compaction"
        ),
        Scenario(
            "recall", "8. Recall: skills_find and memories at task setup as the catalogue grows", "recall"
        ),
        Scenario(
            "prepare",
            "9. Outer loop: a sub-Session's task understanding + orchestration, harness cost",
            "prepare",
        ),
        Scenario("mcp_pool", "10. MCP call overhead: pooled session vs a connection per call", "mcp_pool"),
        Scenario(
            "slow_model",
            "11. Slow model (1 s answers): N Sessions × 5 steps, waits overlapped",
            "slow_model",
        ),
        Scenario(
            "turns",
            "12. Short turns: new Sessions × 5 steps, in-process, what a turn costs around its steps",
            "short_turns",
        ),
    )
}
