"""Drive the real runtime in-process: SessionEngine + Brain + AgentService + ToolService,
with the model replaced only by the scripted HTTP server."""

from sessions_app.choices import InputKind
from sessions_app.models import Message, SessionEvent
from sessions_app.runtime import brain, engine


def new_session(tenant, owner, **kwargs):
    return engine.create_session(tenant=tenant, owner=owner, title=kwargs.pop("title", "test"), **kwargs)


def send(session, text, kind=InputKind.MESSAGE):
    created, _ = engine.enqueue_input(session.pk, kind=kind, payload={"text": text})
    return created


def drive_until_idle(session, max_slices=50, **limits):
    outcomes = []
    for _ in range(max_slices):
        outcome = brain.drive(session.pk, **limits)
        outcomes.append(outcome)
        if outcome != "yielded":
            break
    session.refresh_from_db()
    return outcomes


def event_types(session):
    return list(SessionEvent.objects.filter(session=session).order_by("seq").values_list("type", flat=True))


def assert_gap_free(session):
    seqs = list(SessionEvent.objects.filter(session=session).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


def assert_tool_pairs(session):
    """Every assistant tool call is followed by exactly one tool result with its id, in model order."""
    history = list(Message.objects.filter(session=session).order_by("id"))
    for index, message in enumerate(history):
        if message.role == "assistant" and message.tool_calls:
            ids = [c["id"] for c in message.tool_calls]
            results = [m.tool_call_id for m in history[index + 1 : index + 1 + len(ids)]]
            assert results == ids, f"message {message.pk}: calls {ids} answered by {results}"


def commit_calls(session, token, turn, calls, text=""):
    """An assistant message with tool calls, committed as a runner would (for crash set-ups)."""
    with engine.locked_session(session.pk, token) as locked:
        return engine.append_message(locked, turn.pk, "assistant", text, tool_calls=calls)


def writer_for(session, token):
    return engine.RunnerWriter(session.pk, token, session.tenant_id)
