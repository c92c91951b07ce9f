"""The inner loop on the real runtime, the model replaced by the scripted server only."""

import json
import threading
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions_app.choices import InputKind
from sessions_app.models import Message, ModelCall, RunnerSlice, SessionEvent, Turn
from sessions_app.runtime import brain, engine
from sessions_app.runtime.agent import AgentService
from tests.support.model_server import error_reply, text_reply, tool_call, tool_reply, truncated_reply

from .helpers import assert_gap_free, assert_tool_pairs, drive_until_idle, event_types, new_session, send

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def session(tenant_a, owner_a, model_config_a):
    return new_session(tenant_a, owner_a)


def test_a_three_step_tool_loop_completes_with_paired_history(session, model_server):
    model_server.script(
        "agent",
        tool_reply(tool_call("plan_create", {"title": "Notes", "tasks": ["write", "check"]}, id="c1")),
        tool_reply([tool_call("fs_write", {"path": "notes.md", "content": "# Notes\n"}, id="c2")]),
        tool_reply([tool_call("fs_read", {"path": "notes.md"}, id="c3")]),
        text_reply("Wrote notes.md and checked it."),
    )
    send(session, "Write notes.md")
    drive_until_idle(session)

    assert session.status == "idle"
    turn = Turn.objects.get(session=session)
    assert turn.reason == "completed"
    assert_tool_pairs(session)
    assert_gap_free(session)
    roles = list(Message.objects.filter(session=session).values_list("role", flat=True))
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "assistant"]
    assert (engine.workspace_path(session) / "notes.md").read_text() == "# Notes\n"
    types = event_types(session)
    assert types[:4] == ["session.status", "input.queued", "message.committed", "turn.started"]
    assert types[-2:] == ["turn.ended", "session.status"]
    assert types.count("model.started") == types.count("model.ended") == 4
    assert "plan.updated" in types and "file.changed" in types
    # Each request was reassembled from committed facts: the 4th one carries the 3rd tool result.
    last = model_server.requests_for("agent")[-1]
    assert last.headers["x-xagent-call"] == "agent"
    assert [m["role"] for m in last.messages][-2:] == ["assistant", "tool"]
    assert "# Notes" in last.messages[-1]["content"]


def test_a_truncated_response_executes_nothing_and_ends_max_tokens(session, model_server):
    model_server.script("agent", truncated_reply("fs_write", {"path": "half.txt", "content": "x" * 200}))
    send(session, "write half.txt")
    drive_until_idle(session)

    turn = Turn.objects.get(session=session)
    assert turn.reason == "max_tokens"
    assert not (engine.workspace_path(session) / "half.txt").exists()
    assert not Message.objects.filter(session=session, role="tool").exists()
    assert "tool.started" not in event_types(session)
    assert ModelCall.objects.get(session=session).finish_reason == "length"


def test_bad_arguments_and_unknown_tools_become_results_and_the_loop_goes_on(session, model_server):
    model_server.script(
        "agent",
        tool_reply(
            [
                tool_call("fs_write", '{"path": "a.txt", "content": ', id="bad"),
                tool_call("teleport", {"to": "mars"}, id="nope"),
            ]
        ),
        text_reply("Sorry, retrying later."),
    )
    send(session, "go")
    drive_until_idle(session)

    results = {m.tool_call_id: m for m in Message.objects.filter(session=session, role="tool")}
    assert results["bad"].is_error and "parse_arguments" in results["bad"].content
    assert results["nope"].is_error and "resolve" in results["nope"].content
    assert Turn.objects.get(session=session).reason == "completed"
    assert_tool_pairs(session)


def test_a_provider_500_then_success_is_one_step_with_two_attempts(session, model_server):
    model_server.script("agent", error_reply(500, "upstream hiccup"), text_reply("fine now"))
    send(session, "hello")
    drive_until_idle(session)

    call = ModelCall.objects.get(session=session)
    assert call.attempts == 2 and len(call.attempt_errors) == 1
    assert list(
        Message.objects.filter(session=session, role="assistant").values_list("content", flat=True)
    ) == ["fine now"]
    assert len(model_server.requests_for("agent")) == 2


def test_repeated_identical_failing_calls_end_the_turn_blocked(session, model_server):
    failing = tool_reply([tool_call("fs_read", {"path": "missing.txt"})])
    model_server.script("agent", failing, failing, failing, text_reply("never reached"))
    send(session, "read missing.txt")
    drive_until_idle(session)

    turn = Turn.objects.get(session=session)
    assert turn.reason == "blocked"
    assert "repeated 3 times" in turn.reason_detail
    assert session.status == "idle" and "loop guard" in session.status_reason


def test_guidance_joins_the_next_request_of_the_same_turn(session, model_server, api_owner_a):
    model_server.script(
        "agent",
        tool_reply([tool_call("fs_write", {"path": "a.txt", "content": "a"})]),
        text_reply("done, in French as asked"),
    )
    send(session, "write a.txt")
    assert brain.drive(session.pk, max_steps=1) == "yielded"  # one step, then the slice yields
    assert len(model_server.requests_for("agent")) == 1

    guidance = send(session, "answer in French", kind=InputKind.GUIDANCE)
    drive_until_idle(session)

    first, second = model_server.requests_for("agent")
    assert "answer in French" not in json.dumps(first.messages)
    assert second.messages[-1]["content"] == engine.GUIDANCE_FRAME + "answer in French"
    guidance_message = Message.objects.get(input=guidance)
    assert guidance_message.content == "answer in French"  # stored as written, framed on the wire
    listed = api_owner_a.get(f"/api/v1/sessions/{session.pk}/messages/").json()["results"]
    assert [m["input_kind"] for m in listed if m["role"] == "user"] == ["message", "guidance"]
    evidence = ModelCall.objects.filter(session=session).order_by("id")
    assert evidence[0].last_message_id < guidance_message.pk <= evidence[1].last_message_id
    turns = Turn.objects.filter(session=session)
    assert turns.count() == 1 and turns[0].reason == "completed"


def test_interrupt_before_the_model_answers_at_all_aborts_the_turn_without_waiting(session, model_server):
    """A model that thinks long before its first byte: the interrupt does not wait for it."""
    model_server.script("agent", text_reply("too late", delay_before_s=20))
    send(session, "think hard")

    def interrupt_once_asked():
        model_server.wait_for_requests(1, timeout=10)
        brain.interrupt(session)
        connection.close()

    interrupter = threading.Thread(target=interrupt_once_asked)
    interrupter.start()
    drive_until_idle(session)
    interrupter.join(timeout=10)

    assert Turn.objects.get(session=session).reason == "aborted"
    assert ModelCall.objects.get(session=session).finish_reason == "cancelled"
    # The turn ended before the server sent its first byte: nothing waited for the answer.
    assert model_server.requests_for("agent")[0].started_at is None


def test_interrupt_during_a_slow_stream_aborts_the_turn(session, model_server):
    model_server.script(
        "agent",
        text_reply("word " * 400, chunk_size=5, delay_per_chunk_s=0.05),
        text_reply("second turn answer"),
    )
    send(session, "tell me a long story")

    def run():
        try:
            drive_until_idle(session)
        finally:
            connection.close()  # this thread's own connection, or the test database cannot be dropped

    runner = threading.Thread(target=run)
    runner.start()
    model_server.wait_for_requests(1, timeout=10)
    time.sleep(0.2)
    brain.interrupt(session)  # its wake goes to the broker; this test drives by hand
    runner.join(timeout=10)
    assert not runner.is_alive()

    session.refresh_from_db()
    assert session.status == "interrupted"
    turn = Turn.objects.get(session=session)
    assert turn.reason == "aborted"
    assert ModelCall.objects.get(session=session).finish_reason == "cancelled"

    send(session, "and now something short")
    drive_until_idle(session)
    assert session.status == "idle"
    assert list(Turn.objects.filter(session=session).values_list("reason", flat=True)) == [
        "aborted",
        "completed",
    ]


def test_a_duplicate_runner_finds_the_lease_held_and_leaves(session):
    send(session, "hello")
    token = brain.acquire(session.pk)
    assert token is not None
    assert brain.drive(session.pk) == "busy"
    session.refresh_from_db()
    assert session.wake_requested and session.runner_token == token
    assert not Turn.objects.filter(session=session).exists()


def test_inputs_are_consumed_once_in_order_by_one_runner_at_a_time(session, model_server):
    model_server.default("agent", lambda request: text_reply("ok"))
    inputs = [send(session, f"message {i}") for i in range(12)]
    drive_until_idle(session, max_steps=3)

    turns = list(Turn.objects.filter(session=session).order_by("number"))
    assert [t.inputs.get().pk for t in turns] == [i.pk for i in inputs]
    assert all(t.reason == "completed" for t in turns)
    slices = list(RunnerSlice.objects.filter(session=session).order_by("started_at"))
    assert len(slices) > 1  # bounded slices, re-entered
    for earlier, later in zip(slices, slices[1:], strict=False):
        assert earlier.ended_at <= later.started_at


def listing_agent(session, model_server, text: str) -> AgentService:
    """A slice's agent, prepared on a turn begun by hand, whose model lists the workspace at every
    step (the caller closes it)."""
    model_server.default("agent", lambda request: tool_reply([tool_call("fs_list", {})]))
    send(session, text)
    token = brain.acquire(session.pk)
    turn = engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    agent = AgentService(session.pk, token)
    agent.prepare(turn.pk)
    return agent


def test_queries_per_step_are_few_and_do_not_grow_with_history(session, model_server, settings):
    """Issue #10: a step of a current slice is its three commits (begin, end, one per tool call)
    and nothing else, the same at step 5 and step 300 (history is read once per slice)."""
    settings.XAGENT_MAX_STEPS_PER_TURN = 1000
    agent = listing_agent(session, model_server, "list forever")
    counts, commits = {}, {}
    try:
        for step in range(1, 301):
            assert agent.current
            connection.queries_log.clear()  # the log is capped at 9000 entries
            with CaptureQueriesContext(connection) as queries:
                agent.step()
            sql = [q["sql"] for q in queries.captured_queries]
            commits[step] = sum(s == "COMMIT" for s in sql)
            # Statements that read or write rows (SQLite also logs BEGIN and COMMIT; PostgreSQL not).
            counts[step] = sum(not s.startswith(("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")) for s in sql)
    finally:
        agent.close()
    assert Message.objects.filter(session=session).count() == 601
    assert counts[5] == counts[300] <= 12, counts
    if connection.vendor == "sqlite":
        assert commits[5] == commits[300] == 3, commits
    assert ModelCall.objects.filter(session=session).last().message_count == 599


@pytest.mark.skipif(
    not connection.settings_dict.get("OPTIONS", {}).get("pool"), reason="pooled connections (PostgreSQL) only"
)
def test_a_steps_commits_hand_the_connection_back_to_the_pool(session, model_server):
    """Issue #26: a step's commits are each their own transaction, and its connection goes back
    to the process's pool after each one, not when the thread next waits on its model: through
    the tools and GIL waits between them it would hold one of the process's two connections."""
    agent = listing_agent(session, model_server, "list")
    try:
        agent.step()  # opening commit, the answer's, the tool result's
        assert connection.connection is None
        assert Message.objects.filter(session=session, role="tool").count() == 1
    finally:
        agent.close()


def test_starting_a_turn_writes_the_session_row_once(session):
    """Status, current turn and event seq of a turn's start join one UPDATE (per-turn overhead,
    issue #26)."""
    send(session, "hello")
    token = brain.acquire(session.pk)
    with CaptureQueriesContext(connection) as queries:
        turn = engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())

    updates = [
        q["sql"] for q in queries.captured_queries if q["sql"].startswith('UPDATE "sessions_app_session"')
    ]
    assert len(updates) == 1, updates
    session.refresh_from_db()
    assert (session.status, session.current_turn_id) == ("running", turn.pk)
    assert session.last_event_seq == SessionEvent.objects.filter(session=session).count()


def test_a_config_change_mid_call_applies_from_the_next_request_only(session, model_server, model_config_a):
    model_server.script(
        "agent",
        tool_reply([tool_call("fs_list", {})], delay_before_s=1.0),
        text_reply("done"),
    )
    send(session, "list")

    def run():
        try:
            drive_until_idle(session)
        finally:
            connection.close()

    runner = threading.Thread(target=run)
    runner.start()
    model_server.wait_for_requests(1, timeout=10)
    model_config_a.model = "bigger-model"
    model_config_a.max_output_tokens = 2048
    model_config_a.save()  # saved while the first request is in flight
    runner.join(timeout=20)

    first, second = model_server.requests_for("agent")
    assert (first.body["model"], first.body["max_tokens"]) == ("scripted-model", 1024)
    assert (second.body["model"], second.body["max_tokens"]) == ("bigger-model", 2048)
    assert list(ModelCall.objects.filter(session=session).order_by("id").values_list("model", flat=True)) == [
        "scripted-model",
        "bigger-model",
    ]
    assert Turn.objects.get(session=session).reason == "completed"


def test_a_new_turns_first_step_follows_its_start_without_reading_it_back(session, model_server):
    """Per-turn overhead (issue #26): after `start_turn` the runner steps at once — no second
    boundary (its lock and queue read) and no read of the turn's input or progress it just wrote.
    An input arriving in between still stops the step: see the interrupt tests."""
    model_server.default("agent", lambda request: text_reply("ok"))
    send(session, "hello")
    with CaptureQueriesContext(connection) as queries:
        brain.drive(session.pk)

    sql = [q["sql"] for q in queries.captured_queries]
    started = next(i for i, s in enumerate(sql) if s.startswith('INSERT INTO "sessions_app_turn"'))
    # On PostgreSQL the model call's INSERT rides in the step's one fencing statement.
    called = next(i for i, s in enumerate(sql) if 'INSERT INTO "sessions_app_modelcall"' in s)
    read = [s.split(" FROM ", 1)[1].split(" ", 1)[0] for s in sql[started:called] if s.startswith("SELECT")]
    assert '"sessions_app_input"' not in read and '"sessions_app_turn"' not in read, read
    assert read.count('"sessions_app_session"') == 1, read  # the slice's own read of the Session
    assert Turn.objects.get(session=session).reason == "completed"


def test_a_turn_that_ends_with_nothing_waiting_releases_without_another_boundary(session, model_server):
    """Per-turn overhead (issue #26): after the turn's end the slice releases at once (release
    itself looks at the queue under the row lock); no boundary (lock, queue read) and no look for
    follow-ups the turn's own end said it has not."""
    model_server.default("agent", lambda request: text_reply("ok"))
    send(session, "hello")
    with CaptureQueriesContext(connection) as queries:
        assert brain.drive(session.pk) == "released"

    sql = [q["sql"] for q in queries.captured_queries]
    ended = next(i for i, s in enumerate(sql) if s.startswith('INSERT INTO "sessions_app_delivery"'))
    after = sql[ended:]
    assert sum('FROM "sessions_app_input"' in s for s in after) == 1, after  # release's own look
    assert not any("followups_pending" in s and s.startswith("SELECT") for s in after), after
    session.refresh_from_db()
    assert (session.status, session.runner_token) == ("idle", None)


def test_a_message_sent_during_a_turns_last_call_is_taken_by_the_same_slice(session, model_server):
    model_server.script("agent", text_reply("first", delay_before_s=1.0), text_reply("second"))
    send(session, "one")

    def run():
        try:
            return brain.drive(session.pk)
        finally:
            connection.close()

    runner = threading.Thread(target=run)
    runner.start()
    model_server.wait_for_requests(1, timeout=10)
    send(session, "two")  # queued while the first turn's only call is in flight
    runner.join(timeout=20)

    turns = list(Turn.objects.filter(session=session).order_by("number").values_list("reason", flat=True))
    assert turns == ["completed", "completed"]
    assert RunnerSlice.objects.filter(session=session).count() == 1
    session.refresh_from_db()
    assert (session.status, session.runner_token) == ("idle", None)


def test_a_release_with_nothing_left_is_one_statement_and_takes_no_lock(session):
    """Per-turn overhead (issue #26): the common release (no input, no flag) is one conditional
    UPDATE; anything that needs a look under the lock still gets one."""
    token = brain.acquire(session.pk)
    with CaptureQueriesContext(connection) as queries:
        assert brain.release(session.pk, token) is False
    sql = [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(("BEGIN", "COMMIT"))]
    assert len(sql) == 1 and sql[0].startswith('UPDATE "sessions_app_session"'), sql
    session.refresh_from_db()
    assert (session.runner_token, session.runner_holder, session.lease_expires_at) == (None, "", None)


def test_a_release_keeps_the_lease_for_queued_work_and_clears_a_bare_wake_flag(session):
    token = brain.acquire(session.pk)
    message = send(session, "more work")
    assert brain.release(session.pk, token) is True  # the runner goes on: the message waits for it
    session.refresh_from_db()
    assert session.runner_token == token
    engine.consume_inputs([message], None)
    brain.wake(session.pk)  # a flag and nothing behind it (the work was taken meanwhile)
    assert brain.release(session.pk, token) is False
    session.refresh_from_db()
    assert (session.runner_token, session.wake_requested) == (None, False)


def test_a_release_by_a_runner_that_lost_its_lease_changes_nothing(session):
    lost = brain.acquire(session.pk)
    brain.release(session.pk, lost)
    current = brain.acquire(session.pk)
    with pytest.raises(engine.LeaseLost):
        brain.release(session.pk, lost)
    session.refresh_from_db()
    assert session.runner_token == current


def test_pending_work_as_a_filter_says_what_has_pending_work_says(session, tenant_a, owner_a):
    """The one-statement release decides in the database (`engine.pending_work`); the lock path
    and the sweep's wakes use `has_pending_work`. Every case of the latter, both ways."""
    token = brain.acquire(session.pk)
    send(session, "start")
    turn = engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    cases = []
    for status in ("running", "preparing", "queued", "waiting_approval", "idle", "compressing"):
        for current_turn in (turn, None):
            for kinds in ((), (InputKind.MESSAGE,), (InputKind.INTERRUPT,), (InputKind.APPROVAL_DECISION,)):
                cases.append((status, current_turn, kinds))
    answers = set()
    for status, current_turn, kinds in cases:
        other = new_session(tenant_a, owner_a)
        other.status, other.current_turn = status, current_turn
        other.save(update_fields=["status", "current_turn"])
        for kind in kinds:
            send(other, "queued", kind=kind)
        in_database = type(other).objects.filter(pk=other.pk).filter(engine.pending_work()).exists()
        assert in_database == engine.has_pending_work(other), (status, current_turn, kinds)
        answers.add(in_database)
    assert answers == {True, False}
