"""One audit log (issue #28): each listed action leaves exactly one entry, written by the owner of
the fact, with the right actor, where it came from, and no secret value; `/api/v1/audit/` is the
tenant's, for its owners and admins, filterable, paged by cursor and exportable; nobody changes
or deletes an entry through admin or API."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from approvals_app.models import ApprovalPolicy
from sessions_app.models import ModelConfig
from skills_app import packaging
from skills_app.models import Skill
from tenancy_app.models import ApiKey, AuditEntry, Membership
from tests.approvals.test_approvals_api import approval  # noqa: F401  (a fixture: a pending approval)
from tests.factories import UserFactory
from tests.tenancy.isolation import assert_error_shape
from tools_app.models import MCPServer, Secret, ToolSet

pytestmark = pytest.mark.django_db(transaction=True)

AUDIT = "/api/v1/audit/"
SECRET_VALUE = "sk-live-" + "q" * 24
BROWSER = "AuditTest/1.0"


def admin_client(user) -> Client:
    client = Client(HTTP_USER_AGENT=BROWSER, REMOTE_ADDR="203.0.113.7")
    client.force_login(user)
    return client


_mark = 0


def start() -> None:
    """Entries the fixtures made (a persona's API key) came before the test: count from here."""
    global _mark
    _mark = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0


def only(action: str, tenant) -> AuditEntry:
    entries = list(AuditEntry.objects.for_tenant(tenant).filter(action=action, id__gt=_mark))
    assert len(entries) == 1, [(e.action, e.object_repr) for e in AuditEntry.objects.all()]
    return entries[0]


def no_secret_in(entry: AuditEntry, *secrets: str) -> None:
    text = json.dumps(entry.changes) + entry.object_repr
    for secret in secrets:
        assert secret not in text, entry.changes


# --- sign-in -------------------------------------------------------------------------------------


def test_a_sign_in_and_a_failed_one_name_the_account_and_where_from(tenant_a):
    start()
    user = UserFactory(username="signer")
    user.set_password("right-password-1")
    user.save()
    Membership.objects.create(tenant=tenant_a, user=user, role="member")
    browser = Client(HTTP_USER_AGENT=BROWSER, REMOTE_ADDR="198.51.100.4")

    browser.post("/accounts/login/", {"username": "signer", "password": "wrong-password"})
    failed = only("auth.sign_in_failed", tenant_a)
    assert failed.object_repr == "signer" and failed.actor_username == "" and failed.ip == "198.51.100.4"
    no_secret_in(failed, "wrong-password")

    assert (
        browser.post("/accounts/login/", {"username": "signer", "password": "right-password-1"}).status_code
        == 302
    )
    signed_in = only("auth.signed_in", tenant_a)
    assert (signed_in.actor_username, signed_in.user_agent) == ("signer", BROWSER)


# --- access ----------------------------------------------------------------------------------------


def test_api_keys_created_and_revoked_name_the_key_that_acted(api_owner_a, tenant_a):
    start()
    created = api_owner_a.post("/api/v1/api-keys/", {"name": "deploy bot"}, format="json").json()
    entry = only("api_key.created", tenant_a)
    acting_key = ApiKey.objects.get(prefix=api_owner_a.api_key.split("_")[1])
    assert (entry.actor_username, entry.actor_api_key_id, entry.object_repr) == (
        "owner_a",
        acting_key.pk,
        str(ApiKey.objects.get(pk=created["id"])),
    )
    no_secret_in(entry, created["key"], created["key"].split("_", 2)[2])

    assert api_owner_a.delete(f"/api/v1/api-keys/{created['id']}/").status_code in (200, 204)
    revoked = only("api_key.revoked", tenant_a)
    assert revoked.object_id == str(created["id"]) and revoked.actor_api_key_name == acting_key.name


def test_membership_changes_in_admin_say_before_and_after(owner_a, member_a, tenant_a):
    start()
    # New accounts join a tenant by a superuser's hand; its own admins change roles.
    operator = UserFactory(username="operator", is_staff=True, is_superuser=True)
    newcomer = UserFactory(username="newcomer")
    response = admin_client(operator).post(
        "/admin/tenancy_app/membership/add/", {"tenant": tenant_a.pk, "user": newcomer.pk, "role": "member"}
    )
    assert response.status_code == 302, response.content[:1500]
    assert only("membership.created", tenant_a).actor_username == "operator"

    membership = Membership.objects.get(user=member_a, tenant=tenant_a)
    response = admin_client(owner_a).post(
        f"/admin/tenancy_app/membership/{membership.pk}/change/",
        {"tenant": tenant_a.pk, "user": member_a.pk, "role": "admin"},
    )
    assert response.status_code == 302, response.content[:1500]
    changed = only("membership.role_changed", tenant_a)
    assert changed.changes["role"] == {"before": "member", "after": "admin"}
    assert (changed.ip, changed.user_agent) == ("203.0.113.7", BROWSER)


# --- tenant configuration ---------------------------------------------------------------------------


def test_a_model_configs_new_key_shows_as_changed_never_as_its_value(owner_a, tenant_a):
    start()
    config = ModelConfig.objects.create(tenant=tenant_a, name="main", model="gpt-x", base_url="")
    admin = admin_client(owner_a)
    response = admin.post(
        f"/admin/sessions_app/modelconfig/{config.pk}/change/",
        {
            "tenant": tenant_a.pk,
            "name": "main",
            "base_url": "",
            "api_key": SECRET_VALUE,
            "model": "gpt-y",
            "context_window": 128000,
            "max_output_tokens": 4096,
            "temperature": "",
            "input_price": "2.5",
            "cached_input_price": "",
            "output_price": "10",
        },
    )
    assert response.status_code == 302, response.content[:3000]
    entry = only("modelconfig.changed", tenant_a)
    assert entry.changes["model"] == {"before": "gpt-x", "after": "gpt-y"}
    assert entry.changes["api_key_encrypted"] == {"before": None, "after": "[redacted]"}
    assert entry.changes["input_price"] == {"before": None, "after": "2.5"}
    no_secret_in(entry, SECRET_VALUE)


def test_a_secret_is_named_never_shown(owner_a, tenant_a):
    start()
    response = admin_client(owner_a).post(
        "/admin/tools_app/secret/add/", {"tenant": tenant_a.pk, "name": "STRIPE_KEY", "value": SECRET_VALUE}
    )
    assert response.status_code == 302, response.content[:1500]
    entry = only("secret.created", tenant_a)
    assert (
        entry.object_repr.startswith("STRIPE_KEY")
        and entry.changes["value_encrypted"]["after"] == "[redacted]"
    )
    no_secret_in(entry, SECRET_VALUE, Secret.objects.get().value_encrypted)


def test_quotas_tool_sets_policies_and_mcp_servers_are_recorded(owner_a, tenant_a):
    start()
    admin = admin_client(owner_a)
    response = admin.post(
        "/admin/sessions_app/quota/add/", {"tenant": tenant_a.pk, "period": "month", "max_tokens": 1000}
    )
    assert response.status_code == 302, response.content[:1500]
    assert only("quota.created", tenant_a).changes["max_tokens"] == {"before": None, "after": 1000}

    # What admin's other editors save goes through the same owners (model saves); the request
    # context is what the middleware gives each admin request.
    from django.test import RequestFactory

    from tenancy_app import audit

    request = RequestFactory().post("/admin/", HTTP_USER_AGENT=BROWSER)
    request.user = owner_a
    with audit.acting(request):
        ToolSet.objects.create(tenant=tenant_a, name="research")
        policy = ApprovalPolicy.objects.filter(tenant=tenant_a).first() or ApprovalPolicy.objects.create(
            tenant=tenant_a, name="default"
        )
        policy.name = "stricter"
        policy.save()
        MCPServer.objects.create(
            tenant=tenant_a,
            name="crm",
            transport="http",
            url="https://crm.example.com/mcp",
            headers={"Authorization": f"Bearer {SECRET_VALUE}", "X-Team": "sales"},
        )
    assert only("toolset.created", tenant_a).actor_username == "owner_a"
    assert only("approvalpolicy.changed", tenant_a).changes["name"]["after"] == "stricter"
    server = only("mcpserver.created", tenant_a)
    assert server.changes["headers"]["after"] == {"Authorization": "[redacted]", "X-Team": "sales"}
    no_secret_in(server, SECRET_VALUE)


def test_a_skill_import_and_export_are_one_entry_each(owner_a, tenant_a):
    start()
    from django.test import RequestFactory

    from tenancy_app import audit

    request = RequestFactory().post("/admin/")
    request.user = owner_a
    package = packaging.SkillPackage(
        skill_md=b"---\nname: audited\ndescription: A skill for the audit test.\n---\nBody.\n", files=()
    )
    with audit.acting(request):
        packaging.import_package(package, tenant=tenant_a, by="owner_a")
    imported = only("skill.imported", tenant_a)
    assert imported.object_repr.startswith("audited") and imported.changes["version"] == {"after": 1}
    assert not AuditEntry.objects.filter(action__in=["skill.created", "skill.changed"]).exists()

    response = admin_client(owner_a).post(
        "/admin/skills_app/skill/",
        {"action": "export_selected", "_selected_action": [Skill.objects.get(name="audited").pk]},
    )
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    assert only("skill.exported", tenant_a).actor_username == "owner_a"


# --- work -------------------------------------------------------------------------------------------


def test_an_approval_decision_is_recorded_with_its_decider(api_owner_a, tenant_a, approval):  # noqa: F811
    start()
    response = api_owner_a.post(
        f"/api/v1/approvals/{approval.pk}/decide/",
        {"decision": "reject", "comment": "not now"},
        format="json",
    )
    assert response.status_code == 200, response.content
    entry = only("approval.rejected", tenant_a)
    assert entry.actor_username == "owner_a" and entry.changes["comment"] == {"after": "not now"}


def test_goal_runs_started_and_stopped(api_owner_a, tenant_a, owner_a):
    start()
    from tests.runtime.helpers import new_session

    session = new_session(tenant_a, owner_a)
    started = api_owner_a.post(
        f"/api/v1/sessions/{session.pk}/goal-run/",
        {"goal": "Ship the report", "max_rounds": 3, "token_budget": 10000, "wall_clock_seconds": 600},
        format="json",
    )
    assert started.status_code == 201, started.content
    assert only("goal_run.started", tenant_a).changes["goal"] == {"after": "Ship the report"}
    assert api_owner_a.post(f"/api/v1/sessions/{session.pk}/goal-run/stop/").status_code == 200
    assert only("goal_run.stopped", tenant_a).actor_username == "owner_a"


# --- reading it -------------------------------------------------------------------------------------


@pytest.fixture
def entries(api_owner_a, tenant_a, tenant_b, outsider_b):
    for n in range(3):
        api_owner_a.post("/api/v1/api-keys/", {"name": f"k{n}"}, format="json")
    from tenancy_app import audit

    audit.record("api_key.created", tenant_id=tenant_b.pk, object_repr="bravo's own")
    return AuditEntry.objects.for_tenant(tenant_a)


def test_admins_read_filter_and_page_their_tenants_log(api_owner_a, entries):
    # The three keys created through the API, and the persona's own key (made before, by no one).
    first = api_owner_a.get(AUDIT, {"page_size": 2}).json()
    assert [e["action"] for e in first["results"]] == ["api_key.created"] * 2 and first["next"]
    rest = api_owner_a.get(first["next"]).json()
    assert len(rest["results"]) == 2 and rest["results"][-1]["actor"] == {}
    row = first["results"][0]
    assert set(row) == {
        "id",
        "at",
        "actor",
        "action",
        "object_type",
        "object_id",
        "object_repr",
        "changes",
        "ip",
        "user_agent",
    }
    assert row["actor"]["user"] == "owner_a" and "api_key" in row["actor"]
    assert len(api_owner_a.get(AUDIT, {"action": "api_key."}).json()["results"]) == 4
    assert len(api_owner_a.get(AUDIT, {"actor": "owner_a"}).json()["results"]) == 3
    assert api_owner_a.get(AUDIT, {"actor": "nobody"}).json()["results"] == []
    assert api_owner_a.get(AUDIT, {"from": "2000-01-01", "to": "2000-01-02"}).json()["results"] == []
    assert_error_shape(api_owner_a.get(AUDIT, {"from": "soon"}), 400, "validation_error")


def test_the_log_is_its_tenants_and_its_admins(api_owner_a, api_member_a, api_outsider_b, entries):
    assert_error_shape(api_member_a.get(AUDIT), 403)
    bravo = api_outsider_b.get(AUDIT).json()["results"]
    assert not {e["id"] for e in bravo} & set(entries.values_list("pk", flat=True))
    assert "bravo's own" in [e["object_repr"] for e in bravo]
    mine = {e["id"] for e in api_owner_a.get(AUDIT).json()["results"]}
    assert mine == set(entries.values_list("pk", flat=True))


def test_export_as_csv_and_json_lines(api_owner_a, entries):
    csv_text = b"".join(api_owner_a.get(AUDIT, {"export": "csv"}).streaming_content).decode()
    lines = csv_text.strip().splitlines()
    assert lines[0].startswith("id,at,user,api_key,action") and len(lines) == 1 + 4
    jsonl = b"".join(api_owner_a.get(AUDIT, {"export": "jsonl", "actor": "owner_a"}).streaming_content)
    assert [json.loads(line)["action"] for line in jsonl.decode().splitlines()] == ["api_key.created"] * 3
    assert_error_shape(api_owner_a.get(AUDIT, {"export": "xml"}), 400, "validation_error")


def test_entries_cannot_be_changed_or_deleted_through_the_product(api_owner_a, owner_a, entries, tenant_a):
    entry = entries.first()
    for method in ("post", "put", "patch", "delete"):
        assert getattr(api_owner_a, method)(AUDIT, {}, format="json").status_code == 405
    admin = admin_client(owner_a)
    assert (
        admin.post(f"/admin/tenancy_app/auditentry/{entry.pk}/change/", {"action": "forged"}).status_code
        == 403
    )
    assert admin.post(f"/admin/tenancy_app/auditentry/{entry.pk}/delete/", {"post": "yes"}).status_code == 403
    response = admin.post(
        "/admin/tenancy_app/auditentry/", {"action": "delete_selected", "_selected_action": [entry.pk]}
    )
    assert AuditEntry.objects.filter(pk=entry.pk).exists()
    assert response.status_code in (200, 302)
    with pytest.raises(PermissionError):
        entry.save()
    with pytest.raises(PermissionError):
        entries.update(action="forged")
    with pytest.raises(PermissionError):
        entries.delete()
    assert AuditEntry.objects.filter(pk=entry.pk, action="api_key.created").exists()


def test_the_default_policy_the_product_seeds_is_one_entry_of_its_own(api_owner_a, tenant_a):
    start()
    assert api_owner_a.post("/api/v1/sessions/", {"title": "first"}, format="json").status_code == 201
    seeded = only("approvalpolicy.seeded", tenant_a)
    assert seeded.actor_username == "" and seeded.actor_api_key_id is None  # not the caller's doing
    assert not AuditEntry.objects.filter(id__gt=_mark, action__startswith="approvalrule.").exists()
