"""Context compaction (ARCHITECTURE §5, SCENARIOS S4) on the real runtime; the model is the
scripted server, whose reported usage is its own count of the request it received."""

import json

import pytest

from sessions_app.models import Checkpoint, Message, ModelCall, Session, SessionEvent, Turn
from sessions_app.runtime import engine
from sessions_app.runtime.llm.tokens import Calibration, context_budget
from sessions_app.runtime.summary import STATE_KEYS, SummaryInvalid, parse_state
from tests.support.model_server import json_reply, text_reply, tool_call, tool_reply

from .helpers import assert_gap_free, assert_tool_pairs, drive_until_idle, event_types, new_session, send

pytestmark = pytest.mark.django_db(transaction=True)

WINDOW, MAX_OUTPUT = 6000, 1000
FILES = 24
TASK = "Read every notes file and tell me which one mentions the blue heron."


def valid_state(request=None) -> dict:
    return {
        "goal": TASK,
        "deliverables": ["an answer naming the file"],
        "progress": ["read some notes files"],
        "decisions": [],
        "constraints": [],
        "open_questions": [],
        "next_actions": ["read the remaining files"],
        "artifacts": [],
        "active_user_request": TASK,
    }


@pytest.fixture
def small_window(model_config_a):
    model_config_a.context_window, model_config_a.max_output_tokens = WINDOW, MAX_OUTPUT
    model_config_a.save()
    return context_budget(WINDOW, MAX_OUTPUT)


@pytest.fixture
def reading_session(tenant_a, owner_a, small_window):
    session = new_session(tenant_a, owner_a)
    workspace = engine.workspace_path(session)
    for index in range(FILES):
        line = f"Notes file {index}: " + ("the blue heron" if index == 17 else "nothing of note")
        (workspace / f"notes_{index:02}.txt").write_text((line + " — padding text.\n") * 30)
    return session


def script_reads(model_server):
    model_server.script(
        "agent",
        *[tool_reply(tool_call("fs_read", {"path": f"notes_{i:02}.txt"}, id=f"r{i}")) for i in range(FILES)],
        text_reply("notes_17.txt mentions the blue heron."),
    )


def server_count(request) -> int:
    """What the scripted server reports as prompt tokens for a request (its own 4-chars rule)."""
    return -(-len(json.dumps(request.messages, ensure_ascii=False) + json.dumps(request.tools)) // 4)


def assert_pairs_within(messages):
    """No tool call separated from its result inside one request."""
    for index, message in enumerate(messages):
        if message["role"] == "assistant" and message.get("tool_calls"):
            ids = [c["id"] for c in message["tool_calls"]]
            answered = [m.get("tool_call_id") for m in messages[index + 1 : index + 1 + len(ids)]]
            assert (
                answered == ids
                or answered == ids[: len(answered)]
                and index + len(answered) == len(messages) - 1
            )
        if message["role"] == "tool":
            callers = [m for m in messages[:index] if m["role"] == "assistant" and m.get("tool_calls")]
            assert callers and message["tool_call_id"] in [c["id"] for c in callers[-1]["tool_calls"]]


def test_a_long_turn_compacts_repeatedly_and_every_later_request_fits_the_budget(
    reading_session, small_window, model_server
):
    session = reading_session
    model_server.default("summary", json_reply(valid_state()))
    script_reads(model_server)
    send(session, TASK)
    drive_until_idle(session, max_slices=200)

    turn = Turn.objects.get(session=session)
    assert turn.reason == "completed"
    committed = SessionEvent.objects.filter(session=session, type="compaction.committed")
    assert committed.count() >= 2
    assert {e.data["method"] for e in committed} == {"summary"}
    assert (
        SessionEvent.objects.filter(session=session, type="compaction.started").count() == committed.count()
    )
    assert Checkpoint.objects.filter(session=session, status="committed").count() == committed.count()
    # Every checkpoint names the turn's request as its anchor (the cut passed it each time).
    anchor = Message.objects.get(session=session, role="user")
    assert set(Checkpoint.objects.filter(session=session).values_list("anchor_message_id", flat=True)) == {
        anchor.pk
    }
    # Goals are the Session's: compaction never changes them.
    assert (session.session_goal, session.phase_goal) == (TASK, TASK)

    requests = model_server.requests_for("agent")
    first_compaction = min(e.seq for e in committed)
    later_calls = ModelCall.objects.filter(session=session, purpose="agent").exclude(
        fact_versions__checkpoint_id=None
    )
    assert later_calls.exists()
    for call in later_calls:
        assert call.estimated_prompt_tokens <= small_window
        assert call.prompt_tokens <= small_window  # what the provider reported
    after = [r for r in requests if "Continuity state" in r.messages[0]["content"]]
    assert len(after) == later_calls.count()
    for request in after:
        assert server_count(request) <= small_window
        assert_pairs_within(request.messages)
        # The active request stays the anchor right after the system prompt.
        assert request.messages[1] == {"role": "user", "content": TASK}
    assert first_compaction > 0
    # The summary calls were calls of their own kind, and fit the budget too.
    summaries = model_server.requests_for("summary")
    assert len(summaries) == committed.count()
    assert all(server_count(r) <= small_window for r in summaries)
    assert ModelCall.objects.filter(
        session=session, purpose="summary", ended_at__isnull=False
    ).count() == len(summaries)
    # Raw history is never deleted, and its tool pairs are intact.
    assert Message.objects.filter(session=session, role="tool").count() == FILES
    assert_tool_pairs(session)
    assert_gap_free(session)
    statuses = [e.data["status"] for e in SessionEvent.objects.filter(session=session, type="session.status")]
    assert "compressing" in statuses and statuses[-1] == "idle"


def test_an_invalid_summary_falls_back_to_a_trim_that_says_so(reading_session, small_window, model_server):
    session = reading_session
    model_server.default("summary", text_reply("Sure! Here is a summary: the agent read files."))
    script_reads(model_server)
    send(session, TASK)
    drive_until_idle(session, max_slices=200)

    assert Turn.objects.get(session=session).reason == "completed"
    committed = list(SessionEvent.objects.filter(session=session, type="compaction.committed"))
    assert committed and all(e.data["method"] == "trim" for e in committed)
    assert all("invalid summary: the summary is not JSON" in e.data["reason"] for e in committed)
    # Each committed trim closes the compaction.started of the same checkpoint.
    started = SessionEvent.objects.filter(session=session, type="compaction.started")
    assert [e.data["checkpoint_id"] for e in started] == [e.data["checkpoint_id"] for e in committed]
    assert not Checkpoint.objects.filter(session=session).exclude(status="committed").exists()
    trim = Checkpoint.objects.filter(session=session, status="committed").last()
    assert trim.method == "trim" and trim.reason.startswith("invalid summary")
    assert set(trim.state) == set(STATE_KEYS)
    assert trim.state["active_user_request"] == TASK
    assert any("fs_read(" in line for line in trim.state["progress"])
    for call in ModelCall.objects.filter(session=session, purpose="agent").exclude(
        fact_versions__checkpoint_id=None
    ):
        assert call.estimated_prompt_tokens <= small_window
    assert_tool_pairs(session)


def test_a_failing_summary_call_also_falls_back_to_a_trim(reading_session, small_window, model_server):
    from tests.support.model_server import error_reply

    session = reading_session
    model_server.default("summary", error_reply(400, "bad request"))
    script_reads(model_server)
    send(session, TASK)
    drive_until_idle(session, max_slices=200)

    assert Turn.objects.get(session=session).reason == "completed"
    committed = list(SessionEvent.objects.filter(session=session, type="compaction.committed"))
    assert committed and all(e.data["reason"].startswith("summary call failed") for e in committed)
    assert ModelCall.objects.filter(session=session, purpose="summary").exclude(error="").count() == len(
        committed
    )


def test_a_request_under_budget_is_never_compacted(tenant_a, owner_a, model_config_a, model_server):
    session = new_session(tenant_a, owner_a)
    model_server.script("agent", text_reply("hello"))
    send(session, "hi")
    drive_until_idle(session)
    assert "compaction.started" not in event_types(session)
    assert not model_server.requests_for("summary")


# --- the parts --------------------------------------------------------------------------------


def test_the_boundary_never_separates_a_call_from_its_results(tenant_a, owner_a, small_window):
    history = engine.RequestHistory()
    roles = ["user", "assistant", "tool", "tool", "assistant", "tool", "assistant", "tool", "tool", "tool"]
    for index, role in enumerate(roles, start=1):
        message = Message(pk=index, role=role, content="x" * 800, token_estimate=204)
        message.wire = {"role": role, "content": "x" * 800}
        history.add(message)
    for budget in (300, 600, 1200, 2000, 4000):
        plan = engine.plan_compaction(history, budget=budget, fixed_tokens=100)
        assert plan is not None
        assert history.roles[plan.start_index] != "tool"
        assert plan.covers_to_id == plan.start_id - 1
    # Only tool results after the first call: nothing can be cut legally.
    only_results = engine.RequestHistory()
    for index, role in enumerate(["assistant", "tool", "tool"], start=1):
        message = Message(pk=index, role=role, content="y", token_estimate=5)
        message.wire = {"role": role, "content": "y"}
        only_results.add(message)
    assert engine.plan_compaction(only_results, budget=10, fixed_tokens=0) is None


@pytest.mark.parametrize(
    "text, problem",
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps({"goal": "g"}), "lacks deliverables"),
        (json.dumps({**valid_state(), "progress": {"a": 1}}), "progress must be"),
        (json.dumps({k: "" for k in STATE_KEYS}), "empty"),
        (json.dumps({**valid_state(), "progress": ["x" * 4000]}), "too long"),
    ],
)
def test_a_summary_is_validated_field_by_field(text, problem):
    with pytest.raises(SummaryInvalid, match=problem):
        parse_state(text, max_tokens=500)


def test_a_fenced_summary_is_accepted():
    state = parse_state("```json\n" + json.dumps(valid_state()) + "\n```", max_tokens=500)
    assert state["goal"] == TASK


def test_the_count_starts_from_the_providers_report():
    calibration = Calibration(reported=1200, estimated=1000, context_start_id=7)
    # The report, plus the scaled difference padded by 5% (what no report covers errs high).
    assert calibration.count(1100, 7) == 1200 + 126
    assert calibration.count(500, 9) == 630  # context moved: the scaled estimate alone, padded
    assert Calibration().count(800, None) == 840


def test_recovery_promotes_a_validated_pending_compaction_and_discards_another(
    tenant_a, owner_a, model_config_a
):
    session = new_session(tenant_a, owner_a)
    user = Message.objects.create(tenant=tenant_a, session=session, role="user", content="task")
    kept = Message.objects.create(tenant=tenant_a, session=session, role="assistant", content="next")
    Session.objects.filter(pk=session.pk).update(status="compressing")

    def pending(state):
        return Checkpoint.objects.create(
            tenant=tenant_a,
            session=session,
            start_message=kept,
            covers_from_id=user.pk,
            covers_to_id=user.pk,
            state=state,
        )

    validated = pending(valid_state())
    with engine.locked_session(session.pk) as locked:
        outcome = engine.settle_pending_compaction(locked)
    assert "promoted" in outcome
    session.refresh_from_db()
    assert (session.context_start_message_id, session.context_checkpoint_id) == (kept.pk, validated.pk)
    assert session.status == "running"

    unvalidated = pending({})
    Session.objects.filter(pk=session.pk).update(status="compressing")
    with engine.locked_session(session.pk) as locked:
        outcome = engine.settle_pending_compaction(locked)
    assert "discarded" in outcome
    unvalidated.refresh_from_db()
    session.refresh_from_db()
    assert unvalidated.status == "discarded"
    assert session.context_checkpoint_id == validated.pk  # unchanged
    assert session.status == "running"


def test_an_interrupt_during_the_summary_call_drops_the_compaction_and_stops_the_turn(
    reading_session, small_window, model_server
):
    import threading

    from sessions_app.choices import InputKind

    session = reading_session
    model_server.default("summary", json_reply(valid_state(), delay_before_s=30))
    script_reads(model_server)

    def interrupt_when_summarizing():
        model_server.wait_for_requests(1, purpose="summary", timeout=60)
        send(session, "", kind=InputKind.INTERRUPT)

    watcher = threading.Thread(target=interrupt_when_summarizing, daemon=True)
    watcher.start()
    send(session, TASK)
    drive_until_idle(session, max_slices=200)
    watcher.join(timeout=5)

    turn = Turn.objects.get(session=session)
    assert turn.reason == "aborted"
    assert session.status == "interrupted"
    checkpoint = Checkpoint.objects.get(session=session)
    assert (checkpoint.status, checkpoint.reason) == ("discarded", "interrupted by the user")
    assert "compaction.committed" not in event_types(session)
    discarded = SessionEvent.objects.get(session=session, type="compaction.discarded")
    assert discarded.data["checkpoint_id"] == checkpoint.pk
    # The status went from compressing straight to interrupted (never back to running first).
    statuses = [e.data["status"] for e in SessionEvent.objects.filter(session=session, type="session.status")]
    assert statuses[-2:] == ["compressing", "interrupted"]
    assert session.context_start_message_id is None
    assert ModelCall.objects.get(session=session, purpose="summary").finish_reason == "cancelled"
    assert_tool_pairs(session)


@pytest.mark.parametrize(
    "window, output, problem",
    [
        (4000, 4000, "max_output_tokens must be smaller than context_window"),
        (4000, 3000, "leaves 744 tokens for the request"),
        (0, 0, "must be at least 1"),
        (1, 0, "must be at least 1"),
        (1000, 1, "leaves 743 tokens for the request"),
    ],
)
def test_a_model_configuration_must_leave_room_for_a_request(tenant_a, owner_a, window, output, problem):
    from django.test import Client

    from sessions_app.models import ModelConfig

    admin = Client()
    admin.force_login(owner_a)
    form = {"tenant": tenant_a.pk, "name": "tiny", "base_url": "", "api_key": "", "model": "m",
            "context_window": window, "max_output_tokens": output}  # fmt: skip
    response = admin.post("/admin/sessions_app/modelconfig/add/", form)
    assert response.status_code == 200 and problem in response.content.decode()
    assert not ModelConfig.objects.filter(name="tiny").exists()
    form["context_window"], form["max_output_tokens"] = 8000, 1000
    assert admin.post("/admin/sessions_app/modelconfig/add/", form).status_code == 302


def test_a_hanging_summary_call_is_cut_short_and_trimmed(
    reading_session, small_window, model_server, settings
):
    settings.XAGENT_SUMMARY_TIMEOUT_SECONDS = 1
    session = reading_session
    model_server.default("summary", json_reply(valid_state(), delay_before_s=20))
    script_reads(model_server)
    send(session, TASK)
    drive_until_idle(session, max_slices=200)

    assert Turn.objects.get(session=session).reason == "completed"
    committed = list(SessionEvent.objects.filter(session=session, type="compaction.committed"))
    assert committed and all(e.data["method"] == "trim" for e in committed)
    assert all("Timeout" in e.data["reason"] for e in committed)
    # Two attempts per compaction, no more.
    summaries = ModelCall.objects.filter(session=session, purpose="summary")
    assert {c.attempts for c in summaries} == {2}
    assert len(model_server.requests_for("summary")) == 2 * len(committed)


def test_a_server_that_says_do_not_retry_is_not_retried(tenant_a, owner_a, model_config_a, model_server):
    from tests.support.model_server import error_reply

    session = new_session(tenant_a, owner_a)
    model_server.script("agent", error_reply(500, "broken for good", should_retry=False))
    send(session, "hi")
    drive_until_idle(session)
    assert Turn.objects.get(session=session).reason == "error"
    assert len(model_server.requests_for("agent")) == 1


def test_model_call_evidence_can_be_filtered_by_purpose(
    reading_session, small_window, model_server, api_owner_a
):
    session = reading_session
    model_server.default("summary", json_reply(valid_state()))
    script_reads(model_server)
    send(session, TASK)
    drive_until_idle(session, max_slices=200)

    url = f"/api/v1/sessions/{session.pk}/model-calls/"
    summaries = api_owner_a.get(url, {"purpose": "summary"}).json()["results"]
    assert summaries and {c["purpose"] for c in summaries} == {"summary"}
    assert len(summaries) == len(model_server.requests_for("summary"))
    refused = api_owner_a.get(url, {"purpose": "everything"})
    assert refused.status_code == 400 and "purpose" in refused.json()["error"]["message"]
