"""The runtime is a strict stack (ARCHITECTURE §1, issue: hundreds of Sessions per machine, item 6):

    scheduling, events  <-  engine (facts only)  <-  agent  <-  outer loop / goal driver
        <-  followups  <-  brain

No module of `sessions_app/runtime` reaches, at module level or inside a function, one that
(directly or through others) reaches it back: a circle of imports — dodged with late imports —
fails here. The engine in particular never calls up into the goal driver, the agent or Brain;
what a turn's end moves above it is returned as a fact (`Turn.followups_pending`) and applied
by Brain (runtime/followups.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.approvals.test_import_direction import ROOT, imported_modules

RUNTIME = ROOT / "sessions_app" / "runtime"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def runtime_graph() -> dict[str, set[str]]:
    """module -> the runtime modules it imports (late imports included)."""
    modules = {module_name(p): p for p in RUNTIME.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = imported_modules(path)
        # `from .engine import x` names `...engine.x`: keep what is a module of the runtime.
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_circle_of_imports_inside_the_runtime():
    assert circles(runtime_graph()) == []


def test_a_planted_circle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


ABOVE_THE_ENGINE = {
    "sessions_app.runtime.brain",
    "sessions_app.runtime.followups",
    "sessions_app.runtime.goal_driver",
    "sessions_app.runtime.outer_loop",
    "sessions_app.runtime.agent",
    "sessions_app.runtime.slice_context",
    "sessions_app.runtime.session_port",
}


@pytest.mark.parametrize("path", sorted((RUNTIME / "engine").glob("*.py")), ids=lambda p: p.name)
def test_the_engine_never_calls_up(path):
    assert not imported_modules(path) & ABOVE_THE_ENGINE


@pytest.mark.parametrize("name", ["agent", "outer_loop", "goal_driver", "slice_context", "session_port"])
def test_nothing_below_brain_imports_it(name):
    assert "sessions_app.runtime.brain" not in imported_modules(RUNTIME / f"{name}.py")
