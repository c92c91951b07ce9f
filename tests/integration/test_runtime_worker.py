"""The runtime on the real stack: REST in this process, a separate Celery worker over Redis,
PostgreSQL, and the scripted model server on loopback."""

import threading

import pytest
from django.db import connection

from sessions_app.models import RunnerSlice, Session, SessionEvent, Turn
from tests.runtime.helpers import assert_gap_free, assert_tool_pairs
from tests.support.model_server import text_reply, tool_call, tool_reply

from .conftest import wait_for

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]


def test_a_tool_loop_runs_on_the_worker_to_completion(api_owner_a, model_config_a, model_server, worker):
    model_server.script(
        "agent",
        tool_reply([tool_call("fs_write", {"path": "out.txt", "content": "hi"}, id="w1")]),
        tool_reply([tool_call("fs_read", {"path": "out.txt"}, id="r1")]),
        text_reply("All done."),
    )
    session_id = api_owner_a.post("/api/v1/sessions/", {"title": "on the worker"}, format="json").json()["id"]
    assert (
        api_owner_a.post(
            f"/api/v1/sessions/{session_id}/inputs/", {"text": "write out.txt"}, format="json"
        ).status_code
        == 202
    )

    wait_for(lambda: Turn.objects.filter(session_id=session_id).exclude(reason="").exists(), worker)
    session = Session.objects.get(pk=session_id)
    assert session.status == "idle"
    assert Turn.objects.get(session=session).reason == "completed"
    assert_tool_pairs(session)
    assert_gap_free(session)
    events = api_owner_a.get(f"/api/v1/sessions/{session_id}/events/").json()["events"]
    assert events[-1] == {**events[-1], "type": "session.status", "data": {"status": "idle"}}


def test_fifty_concurrent_inputs_are_consumed_once_in_order_by_one_runner(
    api_owner_a, model_config_a, model_server, worker
):
    model_server.default("agent", lambda request: text_reply("ok: " + request.messages[-1]["content"]))
    session_id = api_owner_a.post("/api/v1/sessions/", {"title": "busy"}, format="json").json()["id"]
    key = api_owner_a.api_key
    answers, errors = [], []

    def post(i):
        from rest_framework.test import APIClient

        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
        try:
            response = client.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": f"n{i}"}, format="json")
            (answers if response.status_code == 202 else errors).append(
                (i, response.status_code, response.content[:200])
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(i,)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(answers) == 50

    wait_for(
        lambda: Turn.objects.filter(session_id=session_id).exclude(reason="").count() == 50,
        worker,
        timeout=180,
    )
    turns = list(Turn.objects.filter(session_id=session_id).order_by("number"))
    consumed = [t.inputs.get() for t in turns]
    assert [i.pk for i in consumed] == sorted(i.pk for i in consumed)  # queue order
    assert all(t.reason == "completed" for t in turns)
    slices = list(
        RunnerSlice.objects.filter(session_id=session_id).exclude(outcome="").order_by("started_at")
    )
    for earlier, later in zip(slices, slices[1:], strict=False):
        assert earlier.ended_at <= later.started_at, "two runners overlapped"
    assert sum(s.inputs_consumed for s in slices) == 50


def test_failure_paths_on_the_worker(api_owner_a, model_config_a, model_server, worker):
    """Truncated output, malformed arguments and a provider 500, three Sessions at once."""
    from tests.support.model_server import error_reply, truncated_reply

    scripts = {
        "truncate": [truncated_reply("fs_write", {"path": "half.txt", "content": "x" * 300})],
        "malformed": [
            tool_reply(
                [
                    tool_call("fs_write", '{"path": "m.txt", "content": ', id="bad"),
                    tool_call("no_such_tool", {}, id="unknown"),
                ]
            ),
            text_reply("recovered"),
        ],
        "flaky": [error_reply(500, "upstream hiccup"), text_reply("fine after a retry")],
    }
    lock = threading.Lock()

    def respond(request):
        task = next(m["content"] for m in request.messages if m["role"] == "user")
        with lock:
            return scripts[task].pop(0)

    model_server.default("agent", respond)
    ids = {}
    for task in scripts:
        ids[task] = api_owner_a.post("/api/v1/sessions/", {"title": task}, format="json").json()["id"]
        api_owner_a.post(f"/api/v1/sessions/{ids[task]}/inputs/", {"text": task}, format="json")
    wait_for(lambda: Turn.objects.filter(session_id__in=ids.values()).exclude(reason="").count() == 3, worker)

    reasons = {task: Turn.objects.get(session_id=sid).reason for task, sid in ids.items()}
    assert reasons == {"truncate": "max_tokens", "malformed": "completed", "flaky": "completed"}
    from sessions_app.models import Message, ModelCall
    from sessions_app.runtime.engine import workspace_path

    assert not (workspace_path(Session.objects.get(pk=ids["truncate"])) / "half.txt").exists()
    assert not Message.objects.filter(session_id=ids["truncate"], role="tool").exists()
    errors = dict(
        Message.objects.filter(session_id=ids["malformed"], role="tool").values_list(
            "tool_call_id", "is_error"
        )
    )
    assert errors == {"bad": True, "unknown": True}
    assert ModelCall.objects.get(session_id=ids["flaky"]).attempts == 2


def test_duplicate_drive_session_deliveries_do_nothing(api_owner_a, model_config_a, model_server, worker):
    from sessions_app.tasks import drive_session

    model_server.script("agent", text_reply("slowly " * 60, chunk_size=7, delay_per_chunk_s=0.03))
    session_id = api_owner_a.post("/api/v1/sessions/", {"title": "dup"}, format="json").json()["id"]
    api_owner_a.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": "go"}, format="json")
    model_server.wait_for_requests(1, timeout=30)
    for _ in range(3):  # redelivered / duplicated while the first runner streams
        drive_session.delay(session_id)
    wait_for(lambda: Turn.objects.filter(session_id=session_id).exclude(reason="").exists(), worker)
    events_after_turn = SessionEvent.objects.filter(session_id=session_id).count()
    slices_before = RunnerSlice.objects.filter(session_id=session_id).count()
    for _ in range(2):  # and after the work is done: one claims the free lease, finds nothing, releases
        drive_session.delay(session_id)
    wait_for(
        lambda: (
            RunnerSlice.objects.filter(session_id=session_id, ended_at__isnull=False).count() > slices_before
        ),
        worker,
    )

    assert len(model_server.requests_for("agent")) == 1
    assert Turn.objects.filter(session_id=session_id).count() == 1
    assert SessionEvent.objects.filter(session_id=session_id).count() == events_after_turn
    slices = list(RunnerSlice.objects.filter(session_id=session_id).order_by("started_at"))
    for earlier, later in zip(slices, slices[1:], strict=False):
        assert earlier.ended_at is None or earlier.ended_at <= later.started_at
