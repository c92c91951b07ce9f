"""XAGENT_STEP_TIME_LIMIT on a real worker process (Celery threads pool over Redis, PostgreSQL).

- A tool that never returns and does not honour the stop: an MCP tool over Streamable HTTP on a
  loopback server (a tenant's endpoint, allow-listed) whose call hangs, with the server's
  `timeout_seconds` an hour. Meanwhile five other Sessions on the same worker take several
  steps each and finish their turns. The step limit stops extending the stuck Session's lease;
  the recovery sweep hands the Session to a fresh runner, which commits an `interrupted` result
  for the call (it changes state: never run again) and the model goes on to finish the turn.
  When the hung call answers at last, its runner's commit is fenced by the lease it lost.
- A model that streams forever (a delta every 0.2 s): the step limit closes the stream and the
  turn ends `error` with the reason naming XAGENT_STEP_TIME_LIMIT.
- two hung MCP calls in one worker do not starve its other Sessions of the process's few
  pooled database connections (a call hands its connection back before it waits).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.utils import timezone

from approvals_app.models import ApprovalPolicy
from approvals_app.policy import ensure_default_policy
from sessions_app.models import Message, ModelCall, RunnerSlice, Session, SessionEvent, Turn
from sessions_app.runtime import brain, engine
from sessions_app.runtime.engine.history import INTERRUPTED_CALL_TEXT
from tests.runtime.helpers import assert_gap_free, assert_tool_pairs
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.mcp.sync import add_server, refresh_server
from tools_app.models import MCPServer

from .processes import database_env_for_workers, free_port, running, wait_for_port, worker_command

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

STEP_LIMIT = 10  # a loaded CI machine may take seconds to reach a cold MCP server: room for that
LEASE_SECONDS = 5
OTHERS, OTHER_STEPS = 5, 3
STUCK_TOOL = "archive__export_report"
STUCK_CALL = "stuck-1"
STOPPED = f"the step ran longer than {STEP_LIMIT} s (XAGENT_STEP_TIME_LIMIT)"


def wait_until(predicate, what: str, worker=None, log: Path | None = None, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if worker is not None:
            assert worker.poll() is None, log.read_text(errors="replace")[-4000:]
        time.sleep(0.1)
    tail = log.read_text(errors="replace")[-4000:] if log is not None else ""
    raise AssertionError(f"timed out waiting for {what}\n{tail}")


def step_limited_env(**extra: str) -> dict[str, str]:
    return {
        **database_env_for_workers(),
        "XAGENT_STEP_TIME_LIMIT": str(STEP_LIMIT),
        "XAGENT_RUNNER_LEASE_SECONDS": str(LEASE_SECONDS),
        **extra,
    }


@pytest.fixture
def stuck_server(tmp_path):
    """tests/support/stuck_mcp_server.py on a free loopback port; released (so its hung call
    ends) and stopped when the test ends."""
    port = free_port()
    record, release, log = tmp_path / "calls.log", tmp_path / "release.flag", tmp_path / "stuck-mcp.log"
    command = [
        sys.executable,
        "-m",
        "tests.support.stuck_mcp_server",
        "--port",
        str(port),
        "--record",
        str(record),
        "--release",
        str(release),
    ]
    with running(command, database_env_for_workers(), log) as proc:
        wait_for_port(port, proc, log)
        yield SimpleNamespace(
            host=f"127.0.0.1:{port}",
            url=f"http://127.0.0.1:{port}/mcp",
            record=record,
            release=release,
            lines=lambda: record.read_text().splitlines() if record.exists() else [],
        )
        release.touch()


def scripted_model(request):
    """Answers from the request alone (any runner may continue any Session)."""
    messages = request.messages
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    text = messages[last_user]["content"]
    after = messages[last_user + 1 :]
    if "export" in text:
        if not after:
            return tool_reply(tool_call(STUCK_TOOL, {"job": "q3"}, id=STUCK_CALL))
        return text_reply("The export was interrupted before it reported back; check the archive first.")
    label = text.split()[-1]
    done = sum(1 for m in after if m["role"] == "assistant")
    if done >= OTHER_STEPS:
        return text_reply(f"Job {label} finished.", delay_before_s=0.1)
    write = {"path": f"step-{done}.txt", "content": f"{label} step {done}"}
    return tool_reply(tool_call("fs_write", write), delay_before_s=0.2)


def add_archive_server(settings, tenant, stuck_server) -> MCPServer:
    """The stuck server as a tenant's own endpoint (not the operator's): it passes the outbound
    guard only because the operator allow-listed it (here; the worker gets the same setting).
    Its calls may take an hour (`timeout_seconds`), and no approval stops them."""
    settings.XAGENT_OUTBOUND_ALLOWED_HOSTS = [stuck_server.host]
    server = add_server(
        tenant,
        "archive",
        MCPServer.Transport.STREAMABLE_HTTP,
        url=stuck_server.url,
        timeout_seconds=3600,
        by_operator=False,
    )
    assert not server.configured_by_operator
    refresh_server(server)
    ensure_default_policy(tenant)
    ApprovalPolicy.objects.filter(tenant=tenant).update(enabled=False)
    return server


def new_session(client, title: str, tools=()) -> str:
    response = client.post("/api/v1/sessions/", {"title": title}, format="json")
    assert response.status_code == 201, response.content
    session_id = response.json()["id"]
    if tools:
        engine.add_selected_capabilities(session_id, None, tools=list(tools), added_by="test")
    return session_id


def post_input(client, session_id: str, text: str) -> None:
    response = client.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": text}, format="json")
    assert response.status_code == 202, response.content


def turn_ended(session_id) -> bool:
    return Turn.objects.filter(session_id=session_id, ended_at__isnull=False).exists()


def test_a_tool_that_ignores_the_stop_is_recovered_while_other_sessions_keep_stepping(
    tmp_path, settings, tenant_a, api_owner_a, model_config_a, model_server, stuck_server
):
    add_archive_server(settings, tenant_a, stuck_server)
    model_server.default("agent", scripted_model)
    stuck = new_session(api_owner_a, "stuck export", tools=[STUCK_TOOL])
    others = [new_session(api_owner_a, f"job {n}") for n in range(OTHERS)]
    log = tmp_path / "worker.log"
    env = step_limited_env(XAGENT_OUTBOUND_ALLOWED_HOSTS=stuck_server.host)

    with running(worker_command("steplimit", concurrency=20), env, log) as worker:
        post_input(api_owner_a, stuck, "export the Q3 report")
        wait_until(lambda: stuck_server.lines() == ["started q3"], "the export call to start", worker, log)
        # The slice that holds the lease now (an earlier one of the Session may have ended
        # already, e.g. one that yielded on a loaded machine).
        [stuck_slice] = RunnerSlice.objects.filter(session_id=stuck, ended_at__isnull=True)
        stuck_token = Session.objects.get(pk=stuck).runner_token
        assert stuck_slice.token == stuck_token and stuck_slice.ended_at is None

        # The stuck call holds one of the worker's threads; the others step on beside it. No
        # recovery sweep runs until they are done (no beat here; the test is the beat below).
        for n, session_id in enumerate(others):
            post_input(api_owner_a, session_id, f"run job {n}")
        wait_until(lambda: all(turn_ended(s) for s in others), "the other Sessions' turns", worker, log)
        assert stuck_server.lines() == ["started q3"]  # still hung: nothing answered it
        assert not Message.objects.filter(session_id=stuck, role="tool").exists()

        # The step limit stopped the step: the watcher no longer extends the stuck lease, so it
        # lapses while the worker (alive, present) still holds the token.
        wait_until(lambda: STOPPED in log.read_text(errors="replace"), "the step limit", worker, log)

        def lapsed() -> bool:
            row = Session.objects.get(pk=stuck)
            return row.runner_token == stuck_token and row.lease_expires_at < timezone.now()

        wait_until(lapsed, "the stuck lease to lapse", worker, log)

        def recovered() -> bool:
            brain.recover_stale_sessions()  # what the beat does every few seconds
            return turn_ended(stuck)

        wait_until(recovered, "the stuck Session's turn to end after recovery", worker, log)
        assert stuck_server.lines() == ["started q3"]  # not run again, and still hung

        # The hung call answers at last: its runner's late commit is fenced by the lost lease.
        stuck_server.release.touch()
        wait_until(
            lambda: RunnerSlice.objects.get(pk=stuck_slice.pk).outcome == "lease_lost",
            "the old runner to give up",
            worker,
            log,
        )
        assert stuck_server.lines() == ["started q3", "released q3"]

    session = Session.objects.get(pk=stuck)
    assert (session.status, session.status_reason, session.runner_token) == ("idle", "", None)
    [turn] = Turn.objects.filter(session=session)
    assert (turn.reason, turn.reason_detail) == ("completed", "")
    [result] = Message.objects.filter(session=session, role="tool")
    assert (result.tool_call_id, result.is_error, result.content) == (STUCK_CALL, True, INTERRUPTED_CALL_TEXT)
    recovered_event = SessionEvent.objects.get(session=session, type="session.recovered")
    assert recovered_event.data["interrupted_calls"] == [
        {"call_id": STUCK_CALL, "tool": STUCK_TOOL, "reason": "runner lost before its result"}
    ]
    assert recovered_event.data["rerun_calls"] == []
    answer = Message.objects.filter(session=session, role="assistant").order_by("-id").first()
    assert answer.content.startswith("The export was interrupted")
    # The model saw the interrupted result (once, as the last message) and answered from it.
    [after_recovery] = [
        r for r in model_server.requests_for("agent") if r.messages[-1].get("tool_call_id") == STUCK_CALL
    ]
    assert after_recovery.messages[-1]["content"] == INTERRUPTED_CALL_TEXT
    outcomes = dict(RunnerSlice.objects.filter(session=session).values_list("pk", "outcome"))
    assert outcomes.pop(stuck_slice.pk) == "lease_lost"
    assert "lease_lost" not in outcomes.values(), outcomes  # the recovering slices kept theirs
    assert_tool_pairs(session)
    assert_gap_free(session)

    # The other Sessions ran their whole turns while the stuck call hung, before the recovery.
    call_started = SessionEvent.objects.get(
        session=session, type="tool.started", data__call_id=STUCK_CALL
    ).created_at
    for session_id in others:
        other = Session.objects.get(pk=session_id)
        [other_turn] = Turn.objects.filter(session=other)
        assert other_turn.reason == "completed", other_turn.reason_detail
        assert call_started < other_turn.started_at < other_turn.ended_at < recovered_event.created_at
        results = Message.objects.filter(session=other, role="tool")
        assert results.count() == OTHER_STEPS and not results.filter(is_error=True).exists()
        workspace = engine.workspace_path(other)
        assert sorted(p.name for p in workspace.glob("step-*.txt")) == [
            f"step-{n}.txt" for n in range(OTHER_STEPS)
        ]
        assert_tool_pairs(other)


def test_a_model_that_streams_forever_is_stopped_and_the_turn_ends_error(
    tmp_path, api_owner_a, model_config_a, model_server
):
    # A delta every 0.2 s for hours: the stream never goes quiet, so no read timeout ends it.
    model_server.script("agent", text_reply("lorem ipsum " * 20000, chunk_size=4, delay_per_chunk_s=0.2))
    session_id = api_owner_a.post("/api/v1/sessions/", {"title": "endless"}, format="json").json()["id"]
    log = tmp_path / "worker.log"

    with running(worker_command("steplimit", concurrency=20), step_limited_env(), log) as worker:
        response = api_owner_a.post(
            f"/api/v1/sessions/{session_id}/inputs/", {"text": "write"}, format="json"
        )
        assert response.status_code == 202
        wait_until(
            lambda: Turn.objects.filter(session_id=session_id, ended_at__isnull=False).exists(),
            "the turn to end",
            worker,
            log,
        )
        [request] = model_server.requests_for("agent")
        wait_until(lambda: request.disconnected, "the stream to be closed", worker, log)

    session = Session.objects.get(pk=session_id)
    [turn] = Turn.objects.filter(session=session)
    assert (turn.reason, turn.reason_detail) == ("error", STOPPED)
    assert (session.status, session.status_reason, session.runner_token) == ("failed", STOPPED, None)
    [call] = ModelCall.objects.filter(session=session)
    assert (call.finish_reason, call.error) == ("cancelled", STOPPED)
    assert call.ended_at is not None
    # The answer had begun streaming when it was closed, far from its end; it was not retried.
    assert request.started_at is not None and request.chunks_sent < 1000, request.chunks_sent
    assert len(model_server.requests_for("agent")) == 1
    status_events = SessionEvent.objects.filter(session=session, type="session.status")
    assert status_events.order_by("-seq").first().data == {"status": "failed", "reason": STOPPED}
    assert SessionEvent.objects.get(session=session, type="turn.ended").data["detail"] == STOPPED
    assert list(RunnerSlice.objects.filter(session=session).values_list("outcome", flat=True)) == ["released"]
    assert_gap_free(session)


def test_two_hung_mcp_calls_do_not_starve_the_other_sessions_of_their_worker(
    tmp_path, settings, tenant_a, api_owner_a, model_config_a, model_server, stuck_server
):
    add_archive_server(settings, tenant_a, stuck_server)
    model_server.default("agent", scripted_model)
    stuck = [new_session(api_owner_a, f"stuck export {n}", tools=[STUCK_TOOL]) for n in range(2)]
    others = [new_session(api_owner_a, f"job {n}") for n in range(OTHERS)]
    log = tmp_path / "worker.log"
    # The default connections (2) and a short pool wait, so a starved worker fails fast.
    env = step_limited_env(
        XAGENT_OUTBOUND_ALLOWED_HOSTS=stuck_server.host,
        XAGENT_WORKER_DB_CONNECTIONS="2",
        XAGENT_DB_POOL_TIMEOUT="10",
    )

    with running(worker_command("steplimit", concurrency=20), env, log) as worker:
        for session_id in stuck:
            post_input(api_owner_a, session_id, "export the Q3 report")
        # Both calls are in flight: one at the server, the other waiting behind it for the
        # pooled MCP session (state-changing calls to one server are serialized).
        wait_until(lambda: stuck_server.lines() == ["started q3"], "the first export call", worker, log)
        wait_until(
            lambda: SessionEvent.objects.filter(session_id__in=stuck, type="tool.started").count() == 2,
            "both export calls to start",
            worker,
            log,
        )
        try:
            for n, session_id in enumerate(others):
                post_input(api_owner_a, session_id, f"run job {n}")

            def starved() -> bool:
                return "couldn't get a connection" in log.read_text(errors="replace")

            wait_until(
                lambda: starved() or all(turn_ended(s) for s in others), "the others' turns", worker, log
            )
            assert not starved(), log.read_text(errors="replace")[-3000:]
        finally:
            stuck_server.release.touch()  # the hung calls answer: the worker can stop at once
    for session_id in others:
        assert Turn.objects.get(session_id=session_id).reason == "completed"
