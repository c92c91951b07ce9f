"""The approval modules never import the Brain or AgentService: a decision enters through
`brain.submit_decision`, so brain -> agent -> approvals never leads back to brain."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNER = {"sessions_app.runtime.brain", "sessions_app.runtime.agent"}


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at module level or inside a function, relative ones resolved."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            found.add(base)
            # `from . import brain` names a module too.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def approval_modules() -> list[Path]:
    own = sorted(p for p in (ROOT / "approvals_app").rglob("*.py") if "migrations" not in p.parts)
    return [ROOT / "sessions_app/runtime/approvals.py", *own]


@pytest.mark.parametrize("path", approval_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_it_never_imports_the_brain_or_the_agent(path):
    assert not imported_modules(path) & RUNNER


@pytest.mark.parametrize(
    "path", [p for p in approval_modules() if p.parts[-2] != "runtime"], ids=lambda p: p.name
)
def test_approvals_app_reaches_into_sessions_app_only_for_the_event_writer(path):
    upward = {m for m in imported_modules(path) if m.split(".")[0] == "sessions_app"}
    assert upward <= {"sessions_app.runtime.events", "sessions_app.runtime.events.emit"}


def test_the_walker_sees_relative_and_lazy_imports():
    module = ROOT / "sessions_app/runtime/approvals.py"
    found = imported_modules(module)
    assert "sessions_app.runtime.engine" in found  # `from . import engine`
    assert "approvals_app.policy" in found  # a lazy import inside a function
