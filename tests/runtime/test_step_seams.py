"""Seams of one step (issue #10): every runner write is fenced by the lease, a step opens only
when nothing the slice cached changed, and one OpenAI client per endpoint and key is reused."""

import json
import uuid

import pytest

from sessions_app.models import Message, ModelCall, Session, Turn
from sessions_app.runtime import brain, engine
from sessions_app.runtime.agent import AgentService
from sessions_app.runtime.llm.config import OPENAI_PROVIDER, EffectiveModel
from sessions_app.runtime.llm.openai_provider import OpenAIChatProvider, client_for, request_body

from .helpers import assert_gap_free, drive_until_idle, new_session, send, writer_for


def model(**changes) -> EffectiveModel:
    base = dict(
        provider=OPENAI_PROVIDER,
        name="m",
        model="x",
        base_url="http://127.0.0.1:9/v1",
        api_key="k1",
        context_window=1000,
        max_output_tokens=100,
    )
    return EffectiveModel(**{**base, **changes})


def test_a_model_configuration_reuses_one_client():
    assert OpenAIChatProvider(model()).client is OpenAIChatProvider(model(temperature=0.3)).client
    assert client_for(model(api_key="k2")) is not client_for(model())
    assert client_for(model(guarded=True)) is not client_for(model())


@pytest.mark.django_db
def test_a_runner_write_from_a_lost_lease_is_refused_and_leaves_nothing(tenant_a, owner_a):
    session = new_session(tenant_a, owner_a)
    token = brain.acquire(session.pk)
    turn = Turn.objects.create(tenant=tenant_a, session=session, number=1)
    writer = writer_for(session, token)
    engine.commit_tool_result(
        writer, turn.pk, call_id="c1", tool="fs_list", content="x", ok=True, summary="x"
    )

    Session.objects.filter(pk=session.pk).update(runner_token=uuid.uuid4())  # another runner took over
    with pytest.raises(engine.LeaseLost):
        engine.commit_tool_result(
            writer, turn.pk, call_id="c2", tool="fs_list", content="y", ok=True, summary="y"
        )

    assert list(Message.objects.filter(session=session).values_list("tool_call_id", flat=True)) == ["c1"]
    assert_gap_free(session)


@pytest.mark.django_db
def test_a_step_does_not_open_when_an_input_waits_and_events_from_elsewhere_keep_seq_gap_free(
    tenant_a, owner_a, django_capture_on_commit_callbacks
):
    session = new_session(tenant_a, owner_a)
    send(session, "start")
    token = brain.acquire(session.pk)
    turn = engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    agent = AgentService(session.pk, token)
    agent.prepare(turn.pk)
    assert agent.current

    # A person's upload while the turn runs: an event from elsewhere, not a reason to re-read.
    engine.record_person_file_change(session.pk, "notes.txt", "created", owner_a)
    engine.commit_tool_result(
        agent.context.writer, turn.pk, call_id="c1", tool="fs_list", content="x", ok=True, summary="x"
    )
    assert agent.current

    # An input waits (its wake flags the live runner): the next step's opening commit refuses.
    with django_capture_on_commit_callbacks(execute=True):
        brain.submit_input(session, kind="guidance", text="also count rows")
    calls_before = ModelCall.objects.count()
    with pytest.raises(engine.StaleSlice):
        engine.begin_model_call(agent.context.writer, turn.pk, agent.context.request())
    assert ModelCall.objects.count() == calls_before
    assert not agent.current
    assert_gap_free(session)


@pytest.mark.django_db
def test_a_policy_rule_added_mid_turn_applies_to_the_next_call_of_the_same_slice(tenant_a, owner_a):
    """The slice loads the policy once; a tenant's configuration change (its version) makes the
    next step's opening commit fail, so the slice re-reads before that call runs."""
    from approvals_app.models import ApprovalPolicy, ApprovalRule

    session = new_session(tenant_a, owner_a)
    send(session, "start")
    token = brain.acquire(session.pk)
    turn = engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    agent = AgentService(session.pk, token)
    agent.prepare(turn.pk)
    policy = ApprovalPolicy.objects.create(tenant=tenant_a, name="strict", priority=1)
    ApprovalRule.objects.create(
        tenant=tenant_a, policy=policy, tool_glob="fs_list", action="deny", reason="no"
    )

    with pytest.raises(engine.StaleSlice):
        engine.begin_model_call(agent.context.writer, turn.pk, agent.context.request())
    agent.prepare(turn.pk)
    verdict = agent.context.approval_verdict(agent.context.tools["fs_list"], {}, agent.context.tool_context)
    assert verdict.action == "deny" and verdict.reason == "no"
    agent.close()


def test_the_request_body_carries_history_as_encoded_and_the_right_token_limit():
    import json as jsonlib

    history = engine.RequestHistory()
    history.set_system("be brief")
    body = request_body(model(), history.messages, [])
    decoded = jsonlib.loads(body)
    assert decoded["messages"] == [{"role": "system", "content": "be brief"}]
    assert decoded["max_tokens"] == 100 and "max_completion_tokens" not in decoded  # a compatible server
    official = jsonlib.loads(
        request_body(model(base_url="https://api.openai.com/v1"), [{"role": "user", "content": "x"}], [])
    )
    assert official["max_completion_tokens"] == 100 and "max_tokens" not in official


def test_a_server_asked_wait_is_honoured_and_capped():
    import httpx2 as httpx
    import openai

    from sessions_app.runtime.llm.openai_provider import MAX_RETRY_AFTER_S, _retry_after

    def rate_limited(**headers):
        request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
        response = httpx.Response(429, headers=headers, request=request)
        return openai.RateLimitError("slow down", response=response, body=None)

    assert _retry_after(rate_limited(**{"retry-after-ms": "250"})) == 0.25
    assert _retry_after(rate_limited(**{"retry-after": "2"})) == 2.0
    assert _retry_after(rate_limited(**{"retry-after": "3600"})) == MAX_RETRY_AFTER_S
    assert _retry_after(rate_limited(**{"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})) is None
    assert _retry_after(rate_limited()) is None


class InstantModel:
    """An in-process model (the XAGENT_MODEL_PROVIDER seam): answers at once, no HTTP."""

    def __init__(self, model):
        self.model = model

    def complete(self, messages, tools, *, purpose, on_delta=None, cancel=None):
        from sessions_app.runtime.llm.base import ModelResult

        return ModelResult(text=f"{len(messages)} messages seen", finish_reason="stop")


@pytest.mark.django_db(transaction=True)
def test_an_in_process_model_plugs_in_by_dotted_path(tenant_a, owner_a, settings):
    settings.XAGENT_MODEL_PROVIDER = f"{__name__}.InstantModel"
    session = new_session(tenant_a, owner_a)
    send(session, "hello")
    drive_until_idle(session)

    call = ModelCall.objects.get(session=session)
    assert (call.provider, call.model) == ("in-process", "InstantModel")
    answer = Message.objects.get(session=session, role="assistant")
    assert answer.content == "2 messages seen"  # the system message and the user's


@pytest.mark.django_db
def test_a_fenced_commit_writes_its_events_in_the_fencing_statement_on_postgresql(tenant_a, owner_a):
    """One round trip fewer per commit (issue #26): the fence UPDATE carries the INSERT of the
    commit's events, which exist only if the fence matched; a mismatch falls back to the locked
    path and the events are written once, renumbered after the ones written elsewhere."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    if connection.vendor != "postgresql":
        pytest.skip("SQLite allows no UPDATE inside a WITH: two statements there")
    session = new_session(tenant_a, owner_a)
    token = brain.acquire(session.pk)
    turn = Turn.objects.create(tenant=tenant_a, session=session, number=1)
    writer = writer_for(session, token)
    session.refresh_from_db()
    writer.observe(
        last_event_seq=session.last_event_seq,
        config_version=session.config_version,
        tenant_config_version=tenant_a.config_version,
    )

    with CaptureQueriesContext(connection) as queries:
        engine.commit_tool_result(
            writer, turn.pk, call_id="c1", tool="fs_list", content="x", ok=True, summary="x"
        )
    statements = [q["sql"] for q in queries.captured_queries]
    assert not any(s.startswith('INSERT INTO "sessions_app_sessionevent"') for s in statements), statements
    assert sum(s.startswith("WITH fenced AS (UPDATE") for s in statements) == 1, statements

    engine.record_person_file_change(session.pk, "notes.txt", "created", owner_a)  # seq moves elsewhere
    engine.commit_tool_result(
        writer, turn.pk, call_id="c2", tool="fs_list", content="y", ok=True, summary="y"
    )

    assert_gap_free(session)
    types = list(session.events.order_by("seq").values_list("type", flat=True))
    assert types.count("tool.ended") == 2 and types.count("file.changed") == 1, types


def observed_writer(session, token, tenant):
    writer = writer_for(session, token)
    session.refresh_from_db()
    writer.observe(
        last_event_seq=session.last_event_seq,
        config_version=session.config_version,
        tenant_config_version=tenant.config_version,
    )
    return writer


@pytest.mark.django_db
def test_a_step_commit_is_one_statement_on_postgresql_and_its_events_name_the_new_rows(
    tenant_a, owner_a, django_capture_on_commit_callbacks
):
    """Issue #26: the model call's begin, its end and each tool result go out as the fencing
    statement alone (no BEGIN/COMMIT round trips); the ids the events name are the rows' own,
    in the log and in what listeners receive."""
    import asyncio

    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from sessions_app.runtime import events

    if connection.vendor != "postgresql":
        pytest.skip("SQLite allows no UPDATE inside a WITH: a transaction of several statements there")
    session = new_session(tenant_a, owner_a)
    token = brain.acquire(session.pk)
    turn = Turn.objects.create(tenant=tenant_a, session=session, number=1)
    writer = observed_writer(session, token, tenant_a)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(events.session_group(session.pk), channel)

    with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks(execute=True):
        message = engine.commit_tool_result(
            writer, turn.pk, call_id="c1", tool="fs_list", content="x", ok=True, summary="x"
        )

    assert len(queries.captured_queries) == 1, [q["sql"] for q in queries.captured_queries]
    stored = Message.objects.get(session=session, tool_call_id="c1")
    assert message.pk == stored.pk and not message._state.adding
    logged = session.events.get(type="message.committed")
    assert logged.data == {"message_id": stored.pk, "role": "tool"}

    async def receive():
        received = await asyncio.wait_for(layer.receive(channel), 10)
        return received.get("events") or [received["event"]]

    sent = {event["type"]: event for event in async_to_sync(receive)()}
    assert sent["message.committed"]["data"] == {"message_id": stored.pk, "role": "tool"}
    assert sent["message.committed"]["seq"] == logged.seq
    assert_gap_free(session)


@pytest.mark.django_db
def test_a_one_statement_commit_from_a_lost_lease_writes_nothing(tenant_a, owner_a):
    session = new_session(tenant_a, owner_a)
    token = brain.acquire(session.pk)
    turn = Turn.objects.create(tenant=tenant_a, session=session, number=1)
    writer = observed_writer(session, token, tenant_a)
    Session.objects.filter(pk=session.pk).update(runner_token=uuid.uuid4())  # another runner took over

    with pytest.raises(engine.LeaseLost):
        engine.commit_tool_result(
            writer, turn.pk, call_id="c1", tool="fs_list", content="y", ok=True, summary="y"
        )

    assert not Message.objects.filter(session=session).exists()
    assert not session.events.filter(type__in=["tool.ended", "message.committed"]).exists()
    assert_gap_free(session)


@pytest.mark.django_db
def test_a_statement_of_its_own_inside_a_one_statement_commit_is_refused(tenant_a, owner_a):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the one-statement commit is PostgreSQL's")
    session = new_session(tenant_a, owner_a)
    token = brain.acquire(session.pk)
    writer = observed_writer(session, token, tenant_a)

    with pytest.raises(RuntimeError, match="statement of its own"), writer.commit(one_statement=True):
        Turn.objects.count()
    assert writer.current  # nothing was sent: the slice's view of the Session still holds


def test_the_tool_schemas_are_encoded_once_per_list_and_a_new_list_afresh():
    tools = [{"type": "function", "function": {"name": "fs_list", "parameters": {"type": "object"}}}]
    first = json.loads(request_body(model(), [{"role": "user", "content": "hi"}], tools))
    again = json.loads(request_body(model(), [{"role": "user", "content": "ho"}], tools))
    other = [{"type": "function", "function": {"name": "fs_read", "parameters": {"type": "object"}}}]
    changed = json.loads(request_body(model(), [{"role": "user", "content": "hi"}], other))

    assert first["tools"] == again["tools"] == tools
    assert again["messages"] == [{"role": "user", "content": "ho"}]
    assert changed["tools"] == other
    assert "tools" not in json.loads(request_body(model(), [], []))
