"""GET /api/v1/skills/ and /skills/{id}/: the tenant's Skills and the global ones (a tenant Skill
hides the global one of its name), cross-tenant 404, constant list queries."""

from __future__ import annotations

import hashlib

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from skills_app import packaging

from ..tenancy.isolation import TenantIsolationContract, assert_error_shape, result_ids
from .helpers import FIXTURES, skill_md

pytestmark = pytest.mark.django_db
URL = "/api/v1/skills/"


def add(tenant, name, description="Does a thing.", body="# Body\n"):
    package = packaging.read_skill_md(skill_md(name, description, body=body))
    return packaging.import_package(package, tenant=tenant, by="test", origin="paste").skill


def add_folder(tenant, name):
    return packaging.import_package(packaging.read_folder(FIXTURES / name), tenant=tenant).skill


class TestSkillIsolation(TenantIsolationContract):
    list_url = URL
    detail_methods = ("get",)

    @pytest.fixture
    def tenant_a_object(self, tenant_a):
        return add_folder(tenant_a, "pdf-report")


def test_the_list_holds_own_and_global_skills_a_tenant_skill_hiding_the_global_one(
    api_owner_a, api_outsider_b, tenant_a, tenant_b
):
    own = add(tenant_a, "shared-name", "A's own version")
    hidden = add(None, "shared-name", "the operator's")
    shared = add(None, "everyone")
    add(tenant_b, "bravo-only")

    rows = api_owner_a.get(URL).json()["results"]

    assert [(r["name"], r["source"]) for r in rows] == [("everyone", "global"), ("shared-name", "tenant")]
    assert rows[1] == {
        "id": own.pk,
        "name": "shared-name",
        "description": "A's own version",
        "source": "tenant",
        "enabled": True,
        "version": 1,
    }
    assert api_owner_a.get(f"{URL}{shared.pk}/").status_code == 200
    assert_error_shape(api_owner_a.get(f"{URL}{hidden.pk}/"), 404, "not_found")
    # Tenant B sees the global ones (nothing of its own hides them), not A's.
    b_ids = result_ids(api_outsider_b, URL)
    assert hidden.pk in b_ids and shared.pk in b_ids and own.pk not in b_ids


def test_pagination_is_by_name(api_owner_a, tenant_a):
    for i in range(5):
        add(tenant_a, f"skill-{i}")
    first = api_owner_a.get(f"{URL}?page_size=2").json()
    assert [r["name"] for r in first["results"]] == ["skill-0", "skill-1"] and first["next"]
    assert result_ids(api_owner_a, f"{URL}?page_size=2") == [
        r["id"] for r in api_owner_a.get(f"{URL}?page_size=10").json()["results"]
    ]


def test_the_detail_adds_body_resources_and_frontmatter(api_member_a, tenant_a):
    skill = add_folder(tenant_a, "csv-cleanup")

    body = api_member_a.get(f"{URL}{skill.pk}/").json()

    assert body["body"].startswith("# CSV cleanup")
    assert body["license"] == "MIT" and body["allowed_tools"] == "fs_read fs_write shell_exec"
    assert body["metadata"] == {"author": "Example Data Team", "version": "1.2"}
    assert body["compatibility"] == "" and body["updated_at"]
    raw = (FIXTURES / "csv-cleanup/assets/expected_columns.csv").read_bytes()
    assert body["resources"][0] == {
        "path": "assets/expected_columns.csv",
        "size": len(raw),
        "sha256": hashlib.sha256(raw).hexdigest(),
    }
    assert [r["path"] for r in body["resources"]] == [
        "assets/expected_columns.csv",
        "assets/sample_messy.csv",
    ]


def test_disabled_skills_are_listed_as_such(api_owner_a, tenant_a):
    packaging.set_enabled(add(tenant_a, "off-skill"), False)
    assert api_owner_a.get(URL).json()["results"][0]["enabled"] is False


def test_writes_are_not_routes(api_owner_a, tenant_a):
    skill = add(tenant_a, "fixed")
    assert api_owner_a.post(URL, {"name": "x"}, format="json").status_code == 405
    assert api_owner_a.delete(f"{URL}{skill.pk}/").status_code == 405


def test_the_list_costs_the_same_queries_for_1_and_10_skills(api_owner_a, tenant_a):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            response = api_owner_a.get(URL)
        assert response.status_code == 200
        return len(captured.captured_queries)

    add(tenant_a, "skill-0")
    add(None, "global-0")
    api_owner_a.get(URL)  # warm per-process look-ups
    one = queries()
    for i in range(1, 10):
        add(tenant_a, f"skill-{i}")
        add(None, f"global-{i}")
    assert len(api_owner_a.get(URL).json()["results"]) == 20
    assert queries() == one
