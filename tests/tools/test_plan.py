import json

import pytest

from tools_app.base import ToolError
from tools_app.native.plan import PlanCreate, PlanUpdate, TaskComplete


def test_plan_create_forwards_to_the_port_and_shows_the_plan_as_compact_json(ctx, port):
    result = PlanCreate().run(ctx, {"title": "Ship", "tasks": ["write", "test"]})

    assert port.calls == [("plan_create", "Ship", ["write", "test"])]
    assert json.loads(result.content) == port.plan
    assert ", " not in result.content and ": " not in result.content
    assert result.summary == "plan: Ship (2 tasks)"


def test_plan_update_sends_string_ids(ctx, port):
    PlanCreate().run(ctx, {"title": "Ship", "tasks": ["write", "test"]})

    result = PlanUpdate().run(ctx, {"updates": [{"id": 1, "status": "in_progress", "title": "write code"}]})

    assert port.calls[-1] == ("plan_update", [{"id": "1", "status": "in_progress", "title": "write code"}])
    assert json.loads(result.content)["tasks"][0] == {
        "id": "1",
        "title": "write code",
        "status": "in_progress",
    }


def test_task_complete_forwards_id_and_summary(ctx, port):
    PlanCreate().run(ctx, {"title": "Ship", "tasks": ["write"]})

    result = TaskComplete().run(ctx, {"task_id": "1", "summary": "written"})

    assert ("task_complete", "1", "written") in port.calls
    assert json.loads(result.content)["tasks"][0]["status"] == "done"


def test_a_refusal_from_the_port_reaches_the_model_as_a_tool_error(ctx):
    with pytest.raises(ToolError) as caught:
        PlanUpdate().run(ctx, {"updates": [{"id": "1", "status": "done"}]})

    assert caught.value.code == "no_plan"
