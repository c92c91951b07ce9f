"""Issue #10 acceptance on the real stack: the worker is killed (SIGKILL) while a tool call runs,
before its result is committed. The next runner closes the call `interrupted`, the next request
the model gets is valid (every call answered), and the tool is not run again."""

import time

import pytest

from approvals_app.models import ApprovalPolicy
from approvals_app.policy import ensure_default_policy
from sessions_app.models import Message, Session, SessionEvent, Turn
from sessions_app.runtime import brain, engine
from tests.runtime.helpers import assert_gap_free, assert_tool_pairs
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.models import Tool, ToolSet

from .processes import database_env_for_workers, running, worker_command

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]
LEASE_SECONDS = 3


def wait_for(predicate, what: str, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_worker_killed_mid_tool_leaves_a_valid_history_and_the_tool_is_not_rerun(
    tmp_path, api_owner_a, tenant_a, model_config_a, model_server
):
    shell = ToolSet.objects.create(tenant=tenant_a, name="shell", is_default=True)
    shell.tools.add(Tool.objects.get(tenant=None, name="shell_exec"))
    ensure_default_policy(tenant_a)
    ApprovalPolicy.objects.filter(tenant=tenant_a).update(enabled=False)  # no approval stop for this call
    model_server.script(
        "agent",
        tool_reply(
            [
                tool_call(
                    "shell_exec",
                    {"command": "echo run >> runs.log; sleep 50", "timeout_seconds": 60},
                    id="s1",
                )
            ]
        ),
        text_reply("The command was interrupted; I did not run it again."),
    )
    env = {**database_env_for_workers(), "XAGENT_RUNNER_LEASE_SECONDS": str(LEASE_SECONDS)}
    session_id = api_owner_a.post("/api/v1/sessions/", {"title": "crash"}, format="json").json()["id"]
    runs_log = engine.workspace_path(Session.objects.get(pk=session_id)) / "runs.log"

    with running(worker_command("doomed"), env, tmp_path / "doomed.log") as doomed:
        api_owner_a.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": "run it"}, format="json")
        wait_for(lambda: runs_log.exists(), "the command to start")
        doomed.kill()  # SIGKILL: no cleanup, no result, the lease stays taken until it lapses
        doomed.wait(timeout=10)

    assert not Message.objects.filter(session_id=session_id, role="tool").exists()
    assert Session.objects.get(pk=session_id).runner_token is not None
    with running(worker_command("heir"), env, tmp_path / "heir.log"):

        def turn_ended() -> bool:
            brain.recover_stale_sessions()  # what the beat sweep does; a no-op while the lease holds
            return Turn.objects.filter(session_id=session_id).exclude(reason="").exists()

        wait_for(turn_ended, "the turn to end")

    session = Session.objects.get(pk=session_id)
    turn = Turn.objects.get(session=session)
    assert turn.reason == "completed"
    assert runs_log.read_text().splitlines() == ["run"]  # started once, never re-run
    closed = Message.objects.get(session=session, role="tool", tool_call_id="s1")
    assert closed.is_error and closed.content.startswith("Interrupted:")
    assert_tool_pairs(session)
    assert_gap_free(session)
    second = model_server.requests_for("agent")[1]
    assert [(m["role"], m.get("tool_call_id")) for m in second.messages[-2:]] == [
        ("assistant", None),
        ("tool", "s1"),
    ]
    assert SessionEvent.objects.filter(session=session, type="session.recovered").count() == 1
