"""Issue #11 item 5 on real worker processes (Celery over Redis, PostgreSQL):

- a deploy's SIGTERM while a slice is busy: the worker finishes the step, hands the Session over
  (lease released, task re-enqueued) and exits; a second worker continues; nothing is lost or
  run twice, and no lease has to lapse;
- a point of a turn that kills its worker every time (SIGKILL here) is retried by the next
  workers until XAGENT_POISON_SLICE_ATTEMPTS losses in a row, then the Session ends `failed`
  with the reason instead of killing workers forever.
"""

import signal
import time

import pytest

from approvals_app.models import ApprovalPolicy
from approvals_app.policy import ensure_default_policy
from sessions_app.models import Message, RunnerSlice, Session, SessionEvent, Turn
from sessions_app.runtime import brain, engine
from tests.runtime.helpers import assert_gap_free, assert_tool_pairs
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.models import Tool, ToolSet

from .processes import database_env_for_workers, running, worker_command

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]
# Takeovers after a kill come from presence (the holder's pid is gone), not from a lapsed lease,
# so the lease need not be short; long enough that a heartbeat delayed on a loaded machine (the
# suite runs on several runners) never hands a live runner's turn to another.
LEASE_SECONDS = 15
ATTEMPTS = 3
SOFT_LIMIT = 15


def wait_for(predicate, what: str, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def shell_session(api_owner_a, tenant_a):
    """A Session that may call shell_exec without an approval stop; yields (id, runs.log path)."""
    shell = ToolSet.objects.create(tenant=tenant_a, name="shell", is_default=True)
    shell.tools.add(Tool.objects.get(tenant=None, name="shell_exec"))
    ensure_default_policy(tenant_a)
    ApprovalPolicy.objects.filter(tenant=tenant_a).update(enabled=False)
    session_id = api_owner_a.post("/api/v1/sessions/", {"title": "worker limits"}, format="json").json()["id"]
    return session_id, engine.workspace_path(Session.objects.get(pk=session_id)) / "runs.log"


def _runs(runs_log) -> int:
    return len(runs_log.read_text().splitlines()) if runs_log.exists() else 0


def _turn_ended(session_id) -> bool:
    brain.recover_stale_sessions()  # what the beat sweep does; a no-op while a lease holds
    return Turn.objects.filter(session_id=session_id).exclude(reason="").exists()


def test_sigterm_mid_slice_hands_the_session_to_the_next_worker(
    tmp_path, api_owner_a, model_config_a, model_server, shell_session
):
    session_id, runs_log = shell_session
    model_server.script(
        "agent",
        tool_reply([tool_call("shell_exec", {"command": "echo run >> runs.log; sleep 3"}, id="s1")]),
        text_reply("The command finished."),
    )
    env = {**database_env_for_workers(), "XAGENT_RUNNER_LEASE_SECONDS": str(LEASE_SECONDS)}

    with running(worker_command("leaving"), env, tmp_path / "leaving.log") as leaving:
        api_owner_a.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": "run it"}, format="json")
        wait_for(lambda: runs_log.exists(), "the command to start")
        leaving.send_signal(signal.SIGTERM)  # warm shutdown, as a deploy sends it
        assert leaving.wait(timeout=60) == 0

    # It finished the step it was in, then handed over instead of asking the model again.
    assert len(model_server.requests_for("agent")) == 1
    assert list(RunnerSlice.objects.filter(session_id=session_id).values_list("outcome", "steps")) == [
        ("yielded", 1)
    ]
    assert Session.objects.get(pk=session_id).runner_token is None  # no lease left to lapse

    with running(worker_command("successor"), env, tmp_path / "successor.log"):
        wait_for(lambda: Turn.objects.filter(session_id=session_id).exclude(reason="").exists(), "the turn")

    session = Session.objects.get(pk=session_id)
    assert Turn.objects.get(session=session).reason == "completed"
    assert _runs(runs_log) == 1  # run once, not again on the second worker
    result = Message.objects.get(session=session, role="tool", tool_call_id="s1")
    assert not result.is_error
    assert len(model_server.requests_for("agent")) == 2
    assert not RunnerSlice.objects.filter(session=session, outcome="lost").exists()
    assert not SessionEvent.objects.filter(session=session, type="session.recovered").exists()
    assert_tool_pairs(session)
    assert_gap_free(session)


def test_a_point_that_kills_its_worker_every_time_ends_the_session_failed_after_k_losses(
    tmp_path, api_owner_a, model_config_a, model_server, shell_session
):
    session_id, runs_log = shell_session
    # Each runner reaches the same point: a command its worker dies in (SIGKILL below).
    model_server.script(
        "agent",
        *[
            tool_reply(
                [
                    tool_call(
                        "shell_exec",
                        {"command": "echo run >> runs.log; sleep 50", "timeout_seconds": 60},
                        id=f"s{attempt}",
                    )
                ]
            )
            for attempt in range(1, ATTEMPTS + 1)
        ],
    )
    env = {
        **database_env_for_workers(),
        "XAGENT_RUNNER_LEASE_SECONDS": str(LEASE_SECONDS),
        "XAGENT_POISON_SLICE_ATTEMPTS": str(ATTEMPTS),
    }
    api_owner_a.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": "run it"}, format="json")

    for attempt in range(1, ATTEMPTS + 1):
        with running(worker_command(f"doomed{attempt}"), env, tmp_path / f"doomed{attempt}.log") as doomed:

            def reached(runs: int = attempt) -> bool:
                brain.recover_stale_sessions()
                return _runs(runs_log) == runs

            wait_for(reached, f"runner {attempt} to reach the point")
            # Not stopped before K losses: a takeover after fewer losses goes on with the turn.
            session = Session.objects.get(pk=session_id)
            assert session.status == "running" and session.current_turn_id is not None
            doomed.kill()
            doomed.wait(timeout=10)

    with running(worker_command("heir"), env, tmp_path / "heir.log"):
        wait_for(lambda: _turn_ended(session_id), "the turn to end")

    session = Session.objects.get(pk=session_id)
    turn = Turn.objects.get(session=session)
    reason = f"the runner was lost {ATTEMPTS} times in a row at this point; stopped to protect the workers"
    assert (turn.reason, turn.reason_detail) == ("error", reason)
    assert (session.status, session.status_reason) == ("failed", reason)
    error = SessionEvent.objects.get(session=session, type="error")
    assert error.data == {"code": "poisoned_slice", "message": reason}
    assert _runs(runs_log) == ATTEMPTS  # the point was not run a K+1-th time
    assert len(model_server.requests_for("agent")) == ATTEMPTS
    assert RunnerSlice.objects.filter(session=session, outcome="lost").count() == ATTEMPTS
    closed = Message.objects.filter(session=session, role="tool").order_by("id")
    assert [(m.tool_call_id, m.is_error) for m in closed] == [
        (f"s{attempt}", True) for attempt in range(1, ATTEMPTS + 1)
    ]
    assert session.runner_token is None
    assert_tool_pairs(session)
    assert_gap_free(session)


def prefork_worker_command(name: str) -> list[str]:
    """A production-like worker: the prefork pool, the only one that enforces time limits."""
    command = worker_command(name)
    pool = command.index("--pool")
    command[pool + 1 : pool + 2] = ["prefork"]
    command[command.index("--concurrency") + 1] = "1"
    return command


def test_a_slice_past_its_soft_time_limit_ends_its_turn_with_that_reason(
    tmp_path, api_owner_a, model_config_a, model_server, shell_session, monkeypatch
):
    from sessions_app.tasks import drive_session

    session_id, runs_log = shell_session
    # The limits travel in the task message, from the process that enqueues (here this one, which
    # caches a task's send options at its first send). The soft one leaves a loaded machine ample
    # time to reach the command (a fresh pool process imports the model client first): it must
    # land while the command runs.
    limits = {"soft_time_limit": SOFT_LIMIT, "time_limit": 60}
    monkeypatch.setattr(drive_session, "_exec_options", {**drive_session._get_exec_options(), **limits})
    model_server.script(
        "agent",
        tool_reply([tool_call("shell_exec", {"command": "echo run >> runs.log; sleep 50"}, id="s1")]),
    )
    env = {
        **database_env_for_workers(),
        # Celery ignores `--pool prefork` when the configuration names a pool: chosen here.
        "XAGENT_WORKER_POOL": "prefork",
        "XAGENT_SLICE_SOFT_TIME_LIMIT": str(SOFT_LIMIT),
        "XAGENT_SLICE_TIME_LIMIT": "60",
    }

    with running(prefork_worker_command("limited"), env, tmp_path / "limited.log"):
        api_owner_a.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": "run it"}, format="json")
        wait_for(lambda: Turn.objects.filter(session_id=session_id).exclude(reason="").exists(), "the turn")

    session = Session.objects.get(pk=session_id)
    turn = Turn.objects.get(session=session)
    assert turn.reason == "error"
    assert turn.reason_detail.startswith(f"the slice exceeded its time limit ({SOFT_LIMIT} s")
    assert (session.status, session.runner_token) == ("failed", None)
    assert _runs(runs_log) == 1
    assert len(model_server.requests_for("agent")) == 1
    closed = Message.objects.get(session=session, role="tool", tool_call_id="s1")
    assert closed.is_error and closed.content.startswith("Interrupted:")
    assert_tool_pairs(session)
