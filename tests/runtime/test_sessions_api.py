"""Sessions REST API: thin edges over the owners, tenant-isolated, CONTRACT shapes."""

import pytest

from sessions_app.models import Input, Message, SessionEvent
from sessions_app.runtime import engine
from tests.tenancy.isolation import (
    assert_cross_tenant_404,
    assert_error_shape,
    assert_list_excludes,
    assert_requires_auth,
)

from .helpers import drive_until_idle, new_session, send

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def session_a(tenant_a, owner_a):
    return new_session(tenant_a, owner_a, title="Acme report")


def test_create_list_retrieve_update_archive(api_owner_a):
    created = api_owner_a.post(
        "/api/v1/sessions/", {"title": "Weekly", "goal": "Ship the report"}, format="json"
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["status"] == "idle" and body["session_goal"] == "Ship the report" and body["kind"] == "main"
    assert body["usage"] == {"prompt_tokens": 0, "completion_tokens": 0}
    assert "fs_write" in body["capabilities"]["tools"]
    assert body["model_label"].startswith("demo model")
    url = f"/api/v1/sessions/{body['id']}/"

    listed = api_owner_a.get("/api/v1/sessions/?status=idle&search=weekly").json()
    assert [s["id"] for s in listed["results"]] == [body["id"]] and "next" in listed
    assert api_owner_a.patch(url, {"title": "Renamed"}, format="json").json()["title"] == "Renamed"
    assert api_owner_a.delete(url).status_code == 204
    # Archived: out of the list and the work routes, still readable (data kept for audit).
    assert api_owner_a.get(url).json()["archived_at"] is not None
    assert body["id"] not in [s["id"] for s in api_owner_a.get("/api/v1/sessions/").json()["results"]]
    assert_error_shape(api_owner_a.post(f"{url}inputs/", {"text": "hi"}, format="json"), 404, "not_found")


def test_archive_list_rename_and_restore(api_owner_a, session_a, tenant_a, owner_a):
    other = new_session(tenant_a, owner_a, title="Quarterly numbers")
    url = f"/api/v1/sessions/{session_a.pk}/"
    assert api_owner_a.delete(url).status_code == 204

    def listed(query=""):
        return [s["id"] for s in api_owner_a.get(f"/api/v1/sessions/{query}").json()["results"]]

    assert listed() == [str(other.pk)]
    assert listed("?archived=true") == [str(session_a.pk)]
    assert listed("?archived=true&search=acme") == [str(session_a.pk)]
    assert listed("?archived=true&search=quarterly") == []
    assert_error_shape(api_owner_a.get("/api/v1/sessions/?archived=maybe"), 400, "validation_error")
    # Renamed while archived, then restored as it was.
    assert api_owner_a.patch(url, {"title": "Acme report (old)"}, format="json").status_code == 200
    restored = api_owner_a.post(f"{url}restore/")
    assert restored.status_code == 200, restored.content
    assert restored.json()["archived_at"] is None and restored.json()["title"] == "Acme report (old)"
    assert sorted(listed()) == sorted([str(session_a.pk), str(other.pk)])
    assert listed("?archived=true") == []
    types = list(SessionEvent.objects.filter(session=session_a).values_list("type", flat=True))
    assert types[-2:] == ["session.archived", "session.restored"]
    # Restoring what is not archived changes nothing and says so with the same answer.
    assert api_owner_a.post(f"{url}restore/").json()["archived_at"] is None
    assert SessionEvent.objects.filter(session=session_a, type="session.restored").count() == 1
    # And work goes on in it.
    assert api_owner_a.post(f"{url}inputs/", {"text": "hi"}, format="json").status_code == 202


def test_another_tenant_cannot_see_or_restore_an_archived_session(api_owner_a, api_outsider_b, session_a):
    assert api_owner_a.delete(f"/api/v1/sessions/{session_a.pk}/").status_code == 204
    assert_error_shape(api_outsider_b.post(f"/api/v1/sessions/{session_a.pk}/restore/"), 404, "not_found")
    assert_error_shape(api_outsider_b.get(f"/api/v1/sessions/{session_a.pk}/"), 404, "not_found")
    assert_list_excludes(api_outsider_b, "/api/v1/sessions/?archived=true", str(session_a.pk))
    session_a.refresh_from_db()
    assert session_a.archived_at is not None


def test_bad_bodies_get_clear_errors(api_owner_a, session_a):
    assert_error_shape(
        api_owner_a.post("/api/v1/sessions/", {"kind": "sub"}, format="json"), 400, "validation_error"
    )
    assert_error_shape(
        api_owner_a.post("/api/v1/sessions/", {"model": "nope"}, format="json"), 400, "validation_error"
    )
    url = f"/api/v1/sessions/{session_a.pk}/inputs/"
    error = assert_error_shape(api_owner_a.post(url, {"text": ""}, format="json"), 400, "validation_error")
    assert "text" in error["details"]
    assert_error_shape(api_owner_a.post(url, {"text": "x", "kind": "approval_decision"}, format="json"), 400)
    assert_error_shape(
        api_owner_a.post(url, "{not json", content_type="application/json"), 400, "malformed_body"
    )
    assert_error_shape(api_owner_a.get(f"/api/v1/sessions/{session_a.pk}/events/?after=abc"), 400)
    assert not Input.objects.filter(session=session_a).exists()


def test_inputs_are_accepted_and_idempotent(api_owner_a, session_a):
    url = f"/api/v1/sessions/{session_a.pk}/inputs/"
    first = api_owner_a.post(url, {"text": "hello"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 202 and first.json()["status"] == "queued"
    again = api_owner_a.post(url, {"text": "hello"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert again.status_code == 200 and again.json()["input_id"] == first.json()["input_id"]
    assert Input.objects.filter(session=session_a).count() == 1
    queued = [e for e in SessionEvent.objects.filter(session=session_a) if e.type == "input.queued"]
    assert len(queued) == 1 and queued[0].data == {"input_id": first.json()["input_id"], "kind": "message"}


def test_history_events_plan_and_evidence_after_a_run(api_owner_a, session_a, model_config_a, model_server):
    from tests.support.model_server import text_reply, tool_call, tool_reply

    model_server.script(
        "agent",
        tool_reply(tool_call("plan_create", {"title": "P", "tasks": ["a"]}, id="c1")),
        text_reply("done"),
    )
    send(session_a, "plan it")
    drive_until_idle(session_a)
    base = f"/api/v1/sessions/{session_a.pk}"

    messages = api_owner_a.get(f"{base}/messages/").json()["results"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    # `send` enqueues as no person; an API input names its sender (checked below).
    assert [m["author"] for m in messages] == [None, None, None, None]
    assert messages[1]["tool_calls"][0]["id"] == "c1" and messages[2]["tool_call_id"] == "c1"
    after = api_owner_a.get(f"{base}/messages/?after={messages[1]['id']}").json()["results"]
    assert [m["id"] for m in after] == [m["id"] for m in messages[2:]]

    events = api_owner_a.get(f"{base}/events/").json()
    assert [e["seq"] for e in events["events"]] == list(range(1, events["last_seq"] + 1))
    tail = api_owner_a.get(f"{base}/events/?after={events['last_seq'] - 2}").json()
    assert [e["seq"] for e in tail["events"]] == [events["last_seq"] - 1, events["last_seq"]]
    empty = api_owner_a.get(f"{base}/events/?after={events['last_seq']}&wait=0.3").json()
    assert empty == {"events": [], "last_seq": events["last_seq"]}

    assert api_owner_a.get(f"{base}/plan/").json() == {
        "plan": {"title": "P", "tasks": [{"id": "t1", "title": "a", "status": "pending"}]}
    }
    accepted = api_owner_a.post(f"{base}/inputs/", {"text": "and again"}, format="json")
    assert accepted.status_code == 202
    drive_until_idle(session_a)
    latest = api_owner_a.get(f"{base}/messages/?after={messages[-1]['id']}").json()["results"]
    assert (latest[0]["role"], latest[0]["author"]) == ("user", "owner_a")
    calls = api_owner_a.get(f"{base}/model-calls/").json()["results"]
    assert len(calls) == 3 and calls[0]["finish_reason"] == "tool_calls" and calls[1]["message_count"] == 3
    assert api_owner_a.get(f"{base}/").json()["usage"]["completion_tokens"] > 0


def test_interrupt_is_queued(api_owner_a, session_a):
    response = api_owner_a.post(f"/api/v1/sessions/{session_a.pk}/interrupt/")
    assert response.status_code == 202
    assert Input.objects.get(pk=response.json()["input_id"]).kind == "interrupt"


SUBROUTES = ["", "messages/", "events/", "model-calls/", "plan/", "goal-run/"]


@pytest.mark.parametrize("suffix", SUBROUTES)
def test_another_tenant_gets_404_on_every_session_route(api_outsider_b, session_a, suffix):
    url = f"/api/v1/sessions/{session_a.pk}/{suffix}"
    methods = ("get", "patch", "delete") if suffix == "" else ("get",)
    assert_cross_tenant_404(
        api_outsider_b, url, methods=methods, data={"title": "mine now"}, hidden=["Acme report"]
    )


def test_another_tenant_cannot_post_inputs_or_interrupt(api_outsider_b, session_a):
    for action in ("inputs/", "interrupt/", "goal-run/", "goal-run/resume/", "goal-run/stop/"):
        response = api_outsider_b.post(
            f"/api/v1/sessions/{session_a.pk}/{action}", {"text": "hi", "goal": "mine now"}, format="json"
        )
        assert_error_shape(response, 404, "not_found")
    assert not Input.objects.filter(session=session_a).exists()
    assert not session_a.goal_runs.exists()
    session_a.refresh_from_db()
    assert session_a.title == "Acme report" and session_a.archived_at is None


def test_lists_and_parents_stay_in_the_tenant(api_outsider_b, session_a):
    assert_list_excludes(api_outsider_b, "/api/v1/sessions/", str(session_a.pk))
    response = api_outsider_b.post(
        "/api/v1/sessions/", {"kind": "sub", "parent": str(session_a.pk)}, format="json"
    )
    assert_error_shape(response, 400, "validation_error")


def test_session_routes_require_auth(api_anonymous, session_a):
    assert_requires_auth(api_anonymous, "/api/v1/sessions/")
    assert_requires_auth(api_anonymous, f"/api/v1/sessions/{session_a.pk}/events/")
    assert not Message.objects.exists()
    assert engine.workspace_path(session_a).is_dir()


def test_archiving_a_session_stops_its_running_turn(api_owner_a, session_a, model_config_a, model_server):
    from sessions_app.models import Turn
    from sessions_app.runtime import brain
    from tests.support.model_server import tool_call, tool_reply

    model_server.default("agent", lambda request: tool_reply([tool_call("fs_list", {})]))
    send(session_a, "list until stopped")
    assert brain.drive(session_a.pk, max_steps=2) == "yielded"  # the turn is running

    assert api_owner_a.delete(f"/api/v1/sessions/{session_a.pk}/").status_code == 204
    drive_until_idle(session_a)

    turn = Turn.objects.get(session=session_a)
    assert turn.reason == "aborted"
    session_a.refresh_from_db()
    assert session_a.archived_at is not None and session_a.status == "interrupted"
    assert Input.objects.filter(session=session_a, kind="interrupt", status="consumed").count() == 1


def test_the_session_list_is_newest_first_across_pages(api_owner_a, tenant_a, owner_a):
    created = [new_session(tenant_a, owner_a, title=f"s{i}").pk for i in range(7)]
    seen, url = [], "/api/v1/sessions/?page_size=3"
    while url:
        page = api_owner_a.get(url).json()
        seen += [row["id"] for row in page["results"]]
        url = page["next"]
    assert seen == [str(pk) for pk in reversed(created)]
