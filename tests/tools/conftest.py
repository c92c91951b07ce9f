"""Fixtures for tools_app unit tests: a workspace under tmp_path, a "host" directory beside it
standing for everything outside the workspace, and a fake SessionPort that records calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools_app.base import ToolContext, ToolError
from tools_app.workspace import workspace_for


class RecordingPort:
    """A SessionPort at the boundary: records what tools asked of the Session."""

    def __init__(self):
        self.file_changes: list[tuple[str, str]] = []
        self.calls: list[tuple] = []
        self.plan: dict | None = None

    def plan_create(self, title: str, tasks: list[str]) -> dict:
        self.calls.append(("plan_create", title, tasks))
        self.plan = {
            "title": title,
            "tasks": [{"id": str(i), "title": t, "status": "pending"} for i, t in enumerate(tasks, start=1)],
        }
        return self.plan

    def plan_update(self, updates: list[dict]) -> dict:
        self.calls.append(("plan_update", updates))
        if self.plan is None:
            raise ToolError("there is no plan yet; call plan_create first", code="no_plan")
        by_id = {t["id"]: t for t in self.plan["tasks"]}
        for update in updates:
            if update["id"] not in by_id:
                raise ToolError(f"unknown task id {update['id']!r}", code="unknown_task")
            by_id[update["id"]]["status"] = update["status"]
            if "title" in update:
                by_id[update["id"]]["title"] = update["title"]
        return self.plan

    def task_complete(self, task_id: str, summary: str) -> dict:
        self.calls.append(("task_complete", task_id, summary))
        return self.plan_update([{"id": task_id, "status": "done"}])

    def file_changed(self, path: str, op: str) -> None:
        self.file_changes.append((path, op))

    def loaded_skill_names(self) -> list[str]:
        return []


@pytest.fixture
def port() -> RecordingPort:
    return RecordingPort()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return workspace_for(tmp_path / "workspaces", "acme", "session-1")


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A directory outside the workspace holding a file no tool may touch."""
    outside = tmp_path / "host"
    outside.mkdir()
    (outside / "secret.txt").write_text("host secret\n")
    return outside


@pytest.fixture
def ctx(workspace: Path, port: RecordingPort) -> ToolContext:
    return ToolContext(session_id="session-1", tenant_id=1, workspace=workspace, port=port)
