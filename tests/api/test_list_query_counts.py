"""List endpoints cost the same number of queries whatever their page size (no N+1)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

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
