"""SCENARIOS S4 on the real stack: a long turn on a separate Celery worker (PostgreSQL, Redis)
outgrows a 6,000-token window; it compacts at least twice and completes, every later request
fits the budget (model-call evidence and what the model server received), no tool call is
separated from its result, and the goals are unchanged."""

import pytest

from sessions_app.models import ModelCall, Session, SessionEvent, Turn
from tests.runtime.helpers import assert_gap_free, assert_tool_pairs
from tests.runtime.test_compaction import (
    FILES,
    MAX_OUTPUT,
    TASK,
    WINDOW,
    assert_pairs_within,
    script_reads,
    server_count,
    valid_state,
)
from tests.support.model_server import json_reply

from .processes import database_env_for_workers, running, worker_command
from .test_runtime_worker import wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def test_s4_a_long_turn_on_the_worker_compacts_and_completes(
    tmp_path, api_owner_a, model_config_a, model_server
):
    from sessions_app.runtime import engine
    from sessions_app.runtime.llm.tokens import context_budget

    model_config_a.context_window, model_config_a.max_output_tokens = WINDOW, MAX_OUTPUT
    model_config_a.save()
    budget = context_budget(WINDOW, MAX_OUTPUT)
    model_server.default("summary", json_reply(valid_state()))
    script_reads(model_server)
    session_id = api_owner_a.post("/api/v1/sessions/", {"title": "S4"}, format="json").json()["id"]
    workspace = engine.workspace_path(Session.objects.get(pk=session_id))
    for index in range(FILES):
        line = f"Notes file {index}: " + ("the blue heron" if index == 17 else "nothing of note")
        (workspace / f"notes_{index:02}.txt").write_text((line + " — padding text.\n") * 30)

    log = tmp_path / "worker.log"
    with running(worker_command("s4"), database_env_for_workers(), log) as worker:
        worker.log_path = log
        api_owner_a.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": TASK}, format="json")
        wait_for(
            lambda: Turn.objects.filter(session_id=session_id).exclude(reason="").exists(),
            worker,
            timeout=120,
        )

    session = Session.objects.get(pk=session_id)
    assert Turn.objects.get(session=session).reason == "completed"
    assert (session.session_goal, session.phase_goal) == (TASK, TASK)
    committed = SessionEvent.objects.filter(session=session, type="compaction.committed")
    assert committed.count() >= 2
    later = ModelCall.objects.filter(session=session, purpose="agent").exclude(
        fact_versions__checkpoint_id=None
    )
    assert later.count() > 0
    assert all(call.prompt_tokens <= budget and call.estimated_prompt_tokens <= budget for call in later)
    compacted_requests = [
        r for r in model_server.requests_for("agent") if "Continuity state" in r.messages[0]["content"]
    ]
    assert len(compacted_requests) == later.count()
    for request in compacted_requests:
        assert server_count(request) <= budget
        assert_pairs_within(request.messages)
    assert_tool_pairs(session)
    assert_gap_free(session)
    # The evidence API shows the summary calls beside the agent steps.
    calls = api_owner_a.get(f"/api/v1/sessions/{session_id}/model-calls/").json()
    calls = calls.get("results", calls) if isinstance(calls, dict) else calls
    assert {c.get("purpose") for c in calls} >= {"agent", "summary"}


def test_a_worker_killed_during_a_pending_compaction_leaves_a_consistent_history(
    tmp_path, api_owner_a, model_config_a, model_server
):
    """SIGKILL while the summary call is in flight: the pending checkpoint (not validated yet) is
    discarded by the next runner, the compaction is redone, and the turn completes."""
    from sessions_app.models import Checkpoint
    from sessions_app.runtime import brain, engine

    model_config_a.context_window, model_config_a.max_output_tokens = WINDOW, MAX_OUTPUT
    model_config_a.save()
    model_server.script("summary", json_reply(valid_state(), delay_before_s=120))
    model_server.default("summary", json_reply(valid_state()))
    script_reads(model_server)
    session_id = api_owner_a.post("/api/v1/sessions/", {"title": "S4 crash"}, format="json").json()["id"]
    workspace = engine.workspace_path(Session.objects.get(pk=session_id))
    for index in range(FILES):
        (workspace / f"notes_{index:02}.txt").write_text(f"Notes file {index}: nothing of note.\n" * 30)
    # The heir takes over because the doomed worker's pid is gone (presence), not by a lapse; a
    # short lease would let a heartbeat delayed on a loaded machine start a second takeover.
    env = {**database_env_for_workers(), "XAGENT_RUNNER_LEASE_SECONDS": "15"}

    with running(worker_command("doomed"), env, tmp_path / "doomed.log") as doomed:
        doomed.log_path = tmp_path / "doomed.log"
        api_owner_a.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": TASK}, format="json")
        wait_for(lambda: model_server.requests_for("summary"), doomed, timeout=120)
        doomed.kill()
        doomed.wait(timeout=10)

    pending = Checkpoint.objects.get(session_id=session_id, status="pending")
    assert Session.objects.get(pk=session_id).status == "compressing"
    with running(worker_command("heir"), env, tmp_path / "heir.log") as heir:
        heir.log_path = tmp_path / "heir.log"

        def turn_ended() -> bool:
            brain.recover_stale_sessions()  # what the periodic sweep does
            return Turn.objects.filter(session_id=session_id).exclude(reason="").exists()

        wait_for(turn_ended, heir, timeout=120)

    session = Session.objects.get(pk=session_id)
    assert Turn.objects.get(session=session).reason == "completed"
    pending.refresh_from_db()
    assert pending.status == "discarded" and "runner was lost" in pending.reason
    assert Checkpoint.objects.filter(session=session, status="committed").exists()
    recovered = SessionEvent.objects.get(session=session, type="session.recovered")
    assert any("discarded" in line for line in recovered.data["restored"])
    assert (session.session_goal, session.phase_goal) == (TASK, TASK)
    assert_tool_pairs(session)
    assert_gap_free(session)
