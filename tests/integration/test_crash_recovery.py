"""Issues #10 and #11 on the real stack: a worker is killed (SIGKILL) mid-turn and a new worker
takes the turn over. Every test runs with a 600 s lease, so the lease never lapses while it
runs: only the presence path (the new worker's start-up sweep finds the dead holder's process
gone) can explain a takeover. Tests assert what happened, never how long it took."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals_app.models import ApprovalPolicy, PendingApproval
from approvals_app.policy import ensure_default_policy
from sessions_app.models import Message, ModelCall, RunnerSlice, Session, SessionEvent, Turn
from sessions_app.runtime import brain, engine
from tests.runtime.helpers import assert_gap_free, assert_tool_pairs
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.models import Tool, ToolSet

from .processes import database_env_for_workers, running, worker_command

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]
LONG_LEASE = "600"


def wait_for(predicate, what: str, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def worker_env():
    return {**database_env_for_workers(), "XAGENT_RUNNER_LEASE_SECONDS": LONG_LEASE}


@pytest.fixture
def shell_for_a(tenant_a):
    shell = ToolSet.objects.create(tenant=tenant_a, name="shell", is_default=True)
    shell.tools.add(Tool.objects.get(tenant=None, name="shell_exec"))
    ensure_default_policy(tenant_a)
    ApprovalPolicy.objects.filter(tenant=tenant_a).update(enabled=False)  # no approval stop here


def _new_session(api) -> str:
    return api.post("/api/v1/sessions/", {"title": "crash"}, format="json").json()["id"]


def _send(api, session_id, text):
    assert (
        api.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": text}, format="json").status_code == 202
    )


def _kill(doomed) -> None:
    doomed.kill()  # SIGKILL: no cleanup, no result, no release; the lease stays taken
    doomed.wait(timeout=10)


def _turns_ended(session_id, count):
    return lambda: Turn.objects.filter(session_id=session_id).exclude(reason="").count() >= count


def _holder_of(session_id) -> str:
    return Session.objects.values_list("runner_holder", flat=True).get(pk=session_id)


def test_a_turn_killed_mid_stream_resumes_on_a_new_worker_and_nothing_runs_twice(
    tmp_path, api_owner_a, tenant_a, model_config_a, model_server, shell_for_a, worker_env
):
    model_server.script(
        "agent",
        tool_reply([tool_call("shell_exec", {"command": "echo run >> count.log"}, id="side")]),
        text_reply("slow " * 400, chunk_size=5, delay_per_chunk_s=0.05),  # killed in here
        text_reply("The command ran once; all done."),
        text_reply("Second request handled."),
    )
    session_id = _new_session(api_owner_a)
    count_log = engine.workspace_path(Session.objects.get(pk=session_id)) / "count.log"

    with running(worker_command("doomed"), worker_env, tmp_path / "doomed.log") as doomed:
        _send(api_owner_a, session_id, "run it")
        model_server.wait_for_requests(2, timeout=60)  # the second step is streaming
        lost_holder = _holder_of(session_id)
        _kill(doomed)
    _send(api_owner_a, session_id, "and one more thing")  # queued while no worker runs

    session = Session.objects.get(pk=session_id)
    # The dead runner's lease still has minutes to run: only its holder being gone frees it.
    assert session.runner_token is not None and session.lease_expires_at > timezone.now() + timedelta(
        minutes=5
    )
    assert Message.objects.filter(session=session, role="tool", tool_call_id="side").count() == 1

    with running(worker_command("heir"), worker_env, tmp_path / "heir.log"):
        wait_for(_turns_ended(session_id, 2), "both turns to end")

    first, second = Turn.objects.filter(session_id=session_id).order_by("number")
    assert first.reason == "completed" and second.reason == "completed"
    assert count_log.read_text().splitlines() == ["run"]  # committed before the kill: never re-run
    lost_call = ModelCall.objects.get(session_id=session_id, finish_reason="interrupted")
    assert "runner was lost" in lost_call.error
    assert [m.content for m in Message.objects.filter(session_id=session_id, role="user").order_by("id")] == [
        "run it",
        "and one more thing",
    ]
    assert RunnerSlice.objects.filter(session_id=session_id, outcome="lost", worker=lost_holder).count() == 1
    recovered = SessionEvent.objects.get(session_id=session_id, type="session.recovered").data
    assert recovered["interrupted_model_calls"] == [lost_call.pk]
    assert recovered["interrupted_calls"] == [] and recovered["rerun_calls"] == []
    assert recovered["restored"] == ["turn 1 after 1 step", "1 queued input"]
    assert recovered["next"] == "the turn continues with step 2"
    # The step was asked again with the same history: the committed call and its result.
    again = model_server.requests_for("agent")[2]
    assert [(m["role"], m.get("tool_call_id")) for m in again.messages[-2:]] == [
        ("assistant", None),
        ("tool", "side"),
    ]
    session.refresh_from_db()
    assert session.runner_token is None and session.runner_holder == ""
    assert_tool_pairs(session)
    assert_gap_free(session)


def test_a_worker_killed_mid_tool_leaves_a_valid_history_and_the_tool_is_not_rerun(
    tmp_path, api_owner_a, tenant_a, model_config_a, model_server, shell_for_a, worker_env
):
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
    session_id = _new_session(api_owner_a)
    runs_log = engine.workspace_path(Session.objects.get(pk=session_id)) / "runs.log"

    with running(worker_command("doomed"), worker_env, tmp_path / "doomed.log") as doomed:
        _send(api_owner_a, session_id, "run it")
        wait_for(lambda: runs_log.exists(), "the command to start")
        _kill(doomed)

    assert not Message.objects.filter(session_id=session_id, role="tool").exists()
    with running(worker_command("heir"), worker_env, tmp_path / "heir.log"):
        wait_for(_turns_ended(session_id, 1), "the turn to end")

    session = Session.objects.get(pk=session_id)
    assert Turn.objects.get(session=session).reason == "completed"
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
    recovered = SessionEvent.objects.get(session=session, type="session.recovered").data
    assert recovered["interrupted_calls"] == [
        {"call_id": "s1", "tool": "shell_exec", "reason": "runner lost before its result"}
    ]


@pytest.mark.parametrize("flag", ["read_only", "idempotent"])
def test_a_read_only_or_idempotent_call_killed_before_its_result_runs_again(
    flag, tmp_path, api_owner_a, tenant_a, model_config_a, model_server, shell_for_a, worker_env
):
    # An admin declared the shell read-only or idempotent: recovery may run its calls again.
    Tool.objects.filter(tenant=None, name="shell_exec").update(**{flag: True})
    model_server.script(
        "agent",
        tool_reply(
            [
                tool_call(
                    "shell_exec",
                    # The first run waits (and is killed); a second one finishes at once.
                    {"command": "echo run >> runs.log; [ $(wc -l < runs.log) -ge 2 ] || sleep 50"},
                    id="again",
                )
            ]
        ),
        text_reply("It ran."),
    )
    session_id = _new_session(api_owner_a)
    runs_log = engine.workspace_path(Session.objects.get(pk=session_id)) / "runs.log"

    with running(worker_command("doomed"), worker_env, tmp_path / "doomed.log") as doomed:
        _send(api_owner_a, session_id, "run it")
        wait_for(lambda: runs_log.exists(), "the command to start")
        _kill(doomed)

    with running(worker_command("heir"), worker_env, tmp_path / "heir.log"):
        wait_for(_turns_ended(session_id, 1), "the turn to end")

    session = Session.objects.get(pk=session_id)
    assert Turn.objects.get(session=session).reason == "completed"
    assert runs_log.read_text().splitlines() == ["run", "run"]
    result = Message.objects.get(session=session, role="tool", tool_call_id="again")
    assert not result.is_error
    recovered = SessionEvent.objects.get(session=session, type="session.recovered").data
    assert recovered["rerun_calls"] == [{"call_id": "again", "tool": "shell_exec"}]
    assert f"re-running {flag.replace('_', '-')} call shell_exec (again)" in recovered["restored"]
    assert_tool_pairs(session)


def test_a_turn_waiting_for_approval_when_its_worker_dies_waits_and_then_completes(
    tmp_path, api_owner_a, owner_a, tenant_a, model_config_a, model_server, worker_env
):
    cleanup = ToolSet.objects.create(tenant=tenant_a, name="cleanup", is_default=True)
    cleanup.tools.add(Tool.objects.get(tenant=None, name="fs_delete_files"))
    model_server.script(
        "agent",
        tool_reply([tool_call("fs_delete_files", {"paths": ["draft.md"]}, id="del")]),
        text_reply("Deleted the draft."),
    )
    session_id = _new_session(api_owner_a)
    draft = engine.workspace_path(Session.objects.get(pk=session_id)) / "draft.md"
    draft.write_text("scratch")

    with running(worker_command("doomed"), worker_env, tmp_path / "doomed.log") as doomed:
        _send(api_owner_a, session_id, "delete draft.md")
        # Parked: the status is committed, then the runner releases its lease and exits; the kill
        # comes after both (a kill in between is a lost runner, which other tests cover).
        wait_for(
            lambda: Session.objects.filter(
                pk=session_id, status="waiting_approval", runner_token=None
            ).exists(),
            "the approval",
        )
        _kill(doomed)

    with running(worker_command("heir"), worker_env, tmp_path / "heir.log") as heir:
        wait_for(lambda: "ready" in (tmp_path / "heir.log").read_text(), "the heir to start")
        assert heir.poll() is None
        assert brain.recover_stale_sessions() == 0  # nothing to wake: it waits for a person
        session = Session.objects.get(pk=session_id)
        assert session.status == "waiting_approval" and draft.exists()
        approval = PendingApproval.objects.get(session_id=session_id)
        assert approval.status == "pending"

        brain.submit_decision(approval, "approve", user=owner_a)
        wait_for(_turns_ended(session_id, 1), "the turn to end")

    assert Turn.objects.get(session_id=session_id).reason == "completed"
    assert not draft.exists()
    assert Message.objects.filter(session_id=session_id, role="tool", tool_call_id="del").count() == 1
