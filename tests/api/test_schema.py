"""The OpenAPI schema describes what the API answers: it validates, every operation documents
the errors it can answer in the CONTRACT shape, lists are paginated, and real answers
(inputs, interrupt, plan, events, history) match their declared schemas."""

import copy

import jsonschema
import pytest
from django.core.management import call_command
from drf_spectacular.drainage import GENERATOR_STATS

from sessions_app.models import Message, Plan, PlanTask

from ..tenancy.isolation import assert_error_shape

SCHEMA_CLASS = "config.schema.AutoSchema"
BODY_METHODS = {"post", "put", "patch"}


@pytest.fixture(autouse=True)
def documenting_schema_class(settings):
    # Until settings.py names it, apply the project's schema class here (a no-op afterwards).
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_SCHEMA_CLASS": SCHEMA_CLASS}


@pytest.fixture
def schema(api_anonymous, db):
    response = api_anonymous.get("/api/v1/schema/?format=json")
    assert response.status_code == 200, response.content[:300]
    return response.json()


def operations(schema):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in {"get", "post", "put", "patch", "delete"}:
                yield path, method, operation


def _json_schema(node):
    """OpenAPI 3.0 -> JSON Schema: `nullable: true` becomes "or null"."""
    if isinstance(node, list):
        return [_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _json_schema(value) for key, value in node.items()}
    if node.pop("nullable", False):
        return {"anyOf": [node, {"type": "null"}]}
    return node


def assert_matches(schema, path, method, status, body):
    """`body` is valid against the schema the OpenAPI document declares for that answer."""
    response = schema["paths"][path][method]["responses"].get(str(status))
    assert response is not None, f"{method.upper()} {path} does not document {status}"
    declared = response["content"]["application/json"]["schema"]
    document = _json_schema({**copy.deepcopy(declared), "components": schema["components"]})
    jsonschema.validate(body, document, cls=jsonschema.Draft7Validator)


@pytest.fixture
def session_id(api_owner_a):
    created = api_owner_a.post("/api/v1/sessions/", {"title": "Schema"}, format="json")
    assert created.status_code == 201
    return created.json()["id"]


def test_the_project_names_the_documenting_schema_class():
    from config import settings as project_settings

    assert project_settings.REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"] == SCHEMA_CLASS


def test_the_schema_generates_without_warnings_and_validates(db, tmp_path):
    GENERATOR_STATS.reset()
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))


def test_every_operation_documents_its_errors(schema):
    error = schema["components"]["schemas"]["Error"]
    assert error["required"] == ["error"] and error["properties"]["error"]["required"] == [
        "code",
        "message",
        "details",
    ]
    for path, method, operation in operations(schema):
        where = f"{method.upper()} {path}"
        responses = operation["responses"]
        expected = {"401", "403", "429"}
        parameters = operation.get("parameters", [])
        if method in BODY_METHODS and "requestBody" in operation:
            expected |= {"400", "413", "415"}
        if any(p["in"] == "query" for p in parameters):
            expected.add("400")
        if "{" in path:
            expected.add("404")
        assert expected <= set(responses), f"{where} misses {sorted(expected - set(responses))}"
        for status, response in responses.items():
            if status.startswith(("4", "5")):
                content = response["content"]["application/json"]["schema"]
                assert content == {"$ref": "#/components/schemas/Error"}, f"{where} {status}: {content}"
                assert response["description"], f"{where} {status} has no description"


def test_a_decision_documents_the_conflict(schema):
    assert "409" in schema["paths"]["/api/v1/approvals/{id}/decide/"]["post"]["responses"]


def test_real_errors_match_the_error_component(schema, api_owner_a, api_anonymous, session_id):
    unknown = "/api/v1/sessions/00000000-0000-0000-0000-000000000000/"
    cases = [
        ("/api/v1/sessions/{id}/", "get", 404, api_owner_a.get(unknown)),
        ("/api/v1/sessions/", "get", 401, api_anonymous.get("/api/v1/sessions/")),
        ("/api/v1/sessions/", "get", 400, api_owner_a.get("/api/v1/sessions/?status=nope")),
        (
            "/api/v1/sessions/{id}/inputs/",
            "post",
            400,
            api_owner_a.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": ""}, format="json"),
        ),
    ]
    for path, method, status, response in cases:
        assert_error_shape(response, status)
        assert_matches(schema, path, method, status, response.json())


def test_inputs_and_interrupt_answer_what_the_schema_declares(schema, api_owner_a, session_id):
    url = f"/api/v1/sessions/{session_id}/inputs/"
    first = api_owner_a.post(url, {"text": "hello"}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    again = api_owner_a.post(url, {"text": "hello"}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    interrupt = api_owner_a.post(f"/api/v1/sessions/{session_id}/interrupt/")

    assert (first.status_code, again.status_code, interrupt.status_code) == (202, 200, 202)
    assert first.json() == {"input_id": first.json()["input_id"], "status": "queued"}
    assert_matches(schema, "/api/v1/sessions/{id}/inputs/", "post", 202, first.json())
    assert_matches(schema, "/api/v1/sessions/{id}/inputs/", "post", 200, again.json())
    assert_matches(schema, "/api/v1/sessions/{id}/interrupt/", "post", 202, interrupt.json())


def test_plan_and_events_answer_what_the_schema_declares(schema, api_owner_a, session_id, tenant_a):
    base = f"/api/v1/sessions/{session_id}"
    no_plan = api_owner_a.get(f"{base}/plan/").json()
    plan = Plan.objects.create(tenant=tenant_a, session_id=session_id, title="P")
    PlanTask.objects.create(tenant=tenant_a, plan=plan, task_id="t1", position=0, title="a")
    with_plan = api_owner_a.get(f"{base}/plan/").json()
    events = api_owner_a.get(f"{base}/events/").json()

    assert no_plan == {"plan": None}
    assert with_plan == {"plan": {"title": "P", "tasks": [{"id": "t1", "title": "a", "status": "pending"}]}}
    assert_matches(schema, "/api/v1/sessions/{id}/plan/", "get", 200, no_plan)
    assert_matches(schema, "/api/v1/sessions/{id}/plan/", "get", 200, with_plan)
    assert events["events"], "a new Session has logged its first status"
    assert_matches(schema, "/api/v1/sessions/{id}/events/", "get", 200, events)


LISTS = [
    "/api/v1/sessions/",
    "/api/v1/sessions/{id}/messages/",
    "/api/v1/sessions/{id}/model-calls/",
    "/api/v1/sessions/{id}/approvals/",
    "/api/v1/sessions/{id}/input-requests/",
    "/api/v1/approvals/",
    "/api/v1/api-keys/",
    "/api/v1/tools/",
]


@pytest.mark.parametrize("path", LISTS)
def test_every_list_is_cursor_paginated(schema, api_owner_a, session_id, path):
    response = api_owner_a.get(path.replace("{id}", session_id))

    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"results", "next", "previous"}
    assert_matches(schema, path, "get", 200, body)
    parameters = {p["name"] for p in schema["paths"][path]["get"]["parameters"]}
    assert {"cursor", "page_size"} <= parameters


def test_history_pages_forward_in_order(schema, api_owner_a, session_id, tenant_a):
    rows = [
        Message.objects.create(tenant=tenant_a, session_id=session_id, role="user", content=f"m{i}")
        for i in range(5)
    ]
    base = f"/api/v1/sessions/{session_id}/messages/"

    first = api_owner_a.get(f"{base}?page_size=2").json()
    second = api_owner_a.get(first["next"]).json()
    after = api_owner_a.get(f"{base}?after={rows[1].pk}&page_size=2").json()
    rest = api_owner_a.get(after["next"]).json()

    assert [m["content"] for m in first["results"] + second["results"]] == ["m0", "m1", "m2", "m3"]
    assert [m["content"] for m in after["results"] + rest["results"]] == ["m2", "m3", "m4"]
    assert rest["next"] is None
    assert_matches(schema, "/api/v1/sessions/{id}/messages/", "get", 200, first)


def test_input_requests_answer_what_the_schema_declares(schema, api_owner_a, session_id):
    from sessions_app.runtime import engine

    request = engine.request_input(
        session_id,
        None,
        call_id="c1",
        server="example",
        tool="example__ask_preference",
        message="Who?",
        schema={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
        timeout_seconds=60,
    )
    base = f"/api/v1/sessions/{session_id}/input-requests/"
    listed = api_owner_a.get(f"{base}?status=pending").json()
    detail = api_owner_a.get(f"{base}{request.pk}/").json()
    refused = api_owner_a.post(f"{base}{request.pk}/answer/", {"action": "accept"}, format="json")
    answered = api_owner_a.post(
        f"{base}{request.pk}/answer/", {"action": "accept", "content": {"name": "Ann"}}, format="json"
    )
    again = api_owner_a.post(f"{base}{request.pk}/answer/", {"action": "decline"}, format="json")

    assert [row["id"] for row in listed["results"]] == [request.pk] and detail["can_answer"]
    assert_matches(schema, "/api/v1/sessions/{id}/input-requests/", "get", 200, listed)
    assert_matches(schema, "/api/v1/sessions/{id}/input-requests/{request_id}/", "get", 200, detail)
    answer_path = "/api/v1/sessions/{id}/input-requests/{request_id}/answer/"
    assert_matches(schema, answer_path, "post", 400, assert_error_shape(refused, 400) and refused.json())
    assert_matches(schema, answer_path, "post", 200, answered.json())
    assert_matches(schema, answer_path, "post", 409, assert_error_shape(again, 409) and again.json())
