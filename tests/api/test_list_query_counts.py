"""List endpoints cost the same number of queries whatever their page size (no N+1)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from approvals_app.choices import ApprovalStatus
from approvals_app.models import PendingApproval
from sessions_app.models import Delivery, Message, ModelConfig, Turn
from sessions_app.runtime import engine

pytestmark = pytest.mark.django_db
ROWS = 25


def queries_for(client, url: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(url)
    assert response.status_code == 200, response.content[:300]
    return len(captured.captured_queries)


def assert_constant_in_page_size(client, url: str) -> None:
    joiner = "&" if "?" in url else "?"
    client.get(url)  # warm: per-process look-ups (tool registry, throttles) are not per row
    small = queries_for(client, f"{url}{joiner}page_size=2")
    large = queries_for(client, f"{url}{joiner}page_size={ROWS}")
    assert small == large, f"{url}: {small} queries for 2 rows, {large} for {ROWS}"


def test_sessions_list(api_owner_a, tenant_a, owner_a):
    ModelConfig.objects.create(
        tenant=tenant_a,
        name="own",
        base_url="https://example.invalid/v1",
        model="m",
        configured_by_operator=True,
    )
    for i in range(ROWS):
        session = engine.create_session(tenant=tenant_a, owner=owner_a, title=f"s{i}")
        engine.add_selected_capabilities(session.pk, None, tools=[f"tool_{i}"], added_by="test")

    assert_constant_in_page_size(api_owner_a, "/api/v1/sessions/")


def test_a_sessions_history_and_deliveries(api_owner_a, tenant_a, owner_a):
    session = engine.create_session(tenant=tenant_a, owner=owner_a, title="history")
    for i in range(ROWS):
        turn = Turn.objects.create(tenant=tenant_a, session=session, number=i + 1)
        Message.objects.create(tenant=tenant_a, session=session, turn=turn, role="user", content=f"m{i}")
        Delivery.objects.create(tenant=tenant_a, session=session, turn=turn, final_answer=f"a{i}")
    base = f"/api/v1/sessions/{session.pk}"

    for url in (f"{base}/messages/", f"{base}/deliveries/", f"{base}/model-calls/", f"{base}/approvals/"):
        assert_constant_in_page_size(api_owner_a, url)


def make_approvals(session, decided_by, count=ROWS):
    """Half pending (the caller's `can_decide` is computed for them), half decided by someone."""
    for i in range(count):
        decided = i % 2 == 1
        PendingApproval.objects.create(
            tenant_id=session.tenant_id,
            session_id=session.pk,
            turn_id=1,
            assistant_message_id=1,
            call_id=f"call-{i}",
            tool="fs_delete_files",
            arguments={"paths": [f"f{i}"]},
            arguments_redacted={"paths": [f"f{i}"]},
            risk="destructive",
            reason="a person must approve it",
            deciders={"session_owner": True, "tenant_admins": True, "roles": ["member"]},
            requested_by_id=session.owner_id,
            status=ApprovalStatus.APPROVED if decided else ApprovalStatus.PENDING,
            decided_by=decided_by if decided else None,
            decided_at=timezone.now() if decided else None,
        )


@pytest.mark.parametrize("persona", ["api_owner_a", "api_member_a"])
def test_approvals_lists(request, persona, tenant_a, owner_a, member_a):
    """Tenant-wide and per-Session lists, for an admin (sees all) and a member (the visibility
    filter): the same queries for 2 rows as for 25, `can_decide` and `decided_by` included."""
    client = request.getfixturevalue(persona)
    owners = engine.create_session(tenant=tenant_a, owner=owner_a, title="owner's")
    members = engine.create_session(tenant=tenant_a, owner=member_a, title="member's")
    make_approvals(owners, decided_by=owner_a)
    make_approvals(members, decided_by=owner_a)

    listed = client.get(f"/api/v1/approvals/?page_size={2 * ROWS}").json()["results"]
    assert len(listed) == 2 * ROWS
    assert {a["can_decide"] for a in listed if a["status"] == "pending"} == {True}
    assert {a["can_decide"] for a in listed if a["status"] != "pending"} == {False}
    for url in (
        "/api/v1/approvals/",
        "/api/v1/approvals/?status=pending",
        f"/api/v1/sessions/{owners.pk}/approvals/",
        f"/api/v1/sessions/{members.pk}/approvals/",
    ):
        assert_constant_in_page_size(client, url)


def test_api_keys_tools_and_events(api_owner_a, tenant_a, owner_a):
    from tenancy_app.actions import do_issue_api_key
    from tools_app.models import Tool

    for i in range(ROWS):
        do_issue_api_key(tenant_a, owner_a, f"key {i}")
        Tool.objects.create(tenant=tenant_a, name=f"tenant_tool_{i}", description="d", input_schema={})
    assert_constant_in_page_size(api_owner_a, "/api/v1/api-keys/")
    assert_constant_in_page_size(api_owner_a, "/api/v1/tools/")

    # The event log pages by `after`, not page_size: a long page costs what a short one does.
    session = engine.create_session(tenant=tenant_a, owner=owner_a, title="events")
    for i in range(ROWS):
        engine.enqueue_input(session.pk, kind="message", payload={"text": f"m{i}"})
    few = queries_for(api_owner_a, f"/api/v1/sessions/{session.pk}/events/?after={ROWS - 1}")
    many = queries_for(api_owner_a, f"/api/v1/sessions/{session.pk}/events/?after=0")
    assert few == many
