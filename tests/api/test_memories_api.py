"""`/api/v1/memories/`: a user lists and deletes their own memories in this tenant. Another
user's memory — a colleague's in the same tenant, or anyone's in another tenant — is a 404."""

from __future__ import annotations

import pytest

from sessions_app.models import Memory
from sessions_app.runtime import memory
from tests.tenancy.isolation import (
    TenantIsolationContract,
    assert_cross_tenant_404,
    assert_error_shape,
    result_ids,
)

URL = "/api/v1/memories/"


def _save(tenant, user, text, kind="topic"):
    return memory.save(tenant_id=tenant.pk, user_id=user.pk, text=text, kind=kind)[0]


class TestMemoryIsolation(TenantIsolationContract):
    list_url = URL
    detail_methods = ("get", "delete")

    @pytest.fixture
    def tenant_a_object(self, tenant_a, owner_a):
        return _save(tenant_a, owner_a, "Alpha's quarterly numbers live in kpis.csv")


def test_a_user_sees_only_their_own_memories_newest_first(
    api_owner_a, api_member_a, tenant_a, owner_a, member_a
):
    older = _save(tenant_a, owner_a, "Owner likes tables", "preference")
    newer = _save(tenant_a, owner_a, "Invoices are due on the 5th", "constraint")
    colleague = _save(tenant_a, member_a, "Member works on billing", "entity")
    assert result_ids(api_owner_a, URL) == [newer.pk, older.pk]
    assert result_ids(api_member_a, URL) == [colleague.pk]
    row = api_owner_a.get(f"{URL}{older.pk}/").json()
    assert row == {
        "id": older.pk,
        "kind": "preference",
        "text": "Owner likes tables",
        "source_session": None,
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }
    # A colleague's memory is as unknown as another tenant's.
    assert_cross_tenant_404(api_member_a, f"{URL}{older.pk}/", methods=("get", "delete"))
    assert Memory.objects.filter(pk=older.pk).exists()


def test_filters_by_kind_and_words(api_owner_a, tenant_a, owner_a):
    tables = _save(tenant_a, owner_a, "Owner likes tables", "preference")
    _save(tenant_a, owner_a, "Invoices are due on the 5th", "constraint")
    assert result_ids(api_owner_a, f"{URL}?kind=preference") == [tables.pk]
    assert result_ids(api_owner_a, f"{URL}?search=LIKES%20tab") == [tables.pk]
    error = assert_error_shape(api_owner_a.get(f"{URL}?kind=secret"), 400, "validation_error")
    assert "kind" in error["details"]


def test_deleting_a_memory_forgets_it(api_owner_a, tenant_a, owner_a):
    gone = _save(tenant_a, owner_a, "Forget me")
    assert api_owner_a.delete(f"{URL}{gone.pk}/").status_code == 204
    assert not Memory.objects.filter(pk=gone.pk).exists()
    assert_error_shape(api_owner_a.get(f"{URL}{gone.pk}/"), 404, "not_found")
    assert memory.recall_for_task(tenant_id=tenant_a.pk, user_id=gone.user_id, request_text="forget me") == []


def test_memories_cannot_be_written_through_the_api(api_owner_a):
    for method in ("post", "put", "patch"):
        response = getattr(api_owner_a, method)(URL, {"text": "x", "kind": "topic"}, format="json")
        assert response.status_code == 405, method
