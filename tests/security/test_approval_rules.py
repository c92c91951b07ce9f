"""Approval rules an admin writes: regexes run on RE2 (linear time), "Test a call" uses the
catalog's facts about a tool (the same the runtime uses), and a deny's reason reaches the model
and the tool card."""

import json

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from approvals_app.choices import PolicyAction
from approvals_app.policy import CallFacts, evaluate, tool_facts
from approvals_app.policy_models import ApprovalPolicy, ApprovalRule, compile_conditions
from sessions_app.models import Message, SessionEvent
from sessions_app.runtime import approvals, engine
from tests.approvals.test_policy_admin import add_form
from tests.runtime.helpers import assert_tool_pairs, drive_until_idle, new_session, send
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.catalog import resolve_available
from tools_app.models import MCPServer, Tool, ToolSet

TEST_URL = "/admin/approvals_app/approvalpolicy/test/"
CATASTROPHIC = "(a+)+$"
NEVER = "Deleting customer data is never allowed"


def rule(tenant, *, policy_name="Security", **fields):
    policy, _ = ApprovalPolicy.objects.get_or_create(tenant=tenant, name=policy_name)
    return ApprovalRule.objects.create(tenant=tenant, policy=policy, **fields)


def facts(name="fs_write", risk="write"):
    return CallFacts(name=name, source="native", risk=risk)


# --- regexes run on RE2 -------------------------------------------------------------------------


@pytest.mark.django_db
class TestRegexEngine:
    def test_a_catastrophic_pattern_finishes_against_a_long_input(self, tenant_a):
        conditions = [{"path": "$.paths[*]", "regex": CATASTROPHIC}]
        rule(tenant_a, argument_conditions=conditions, action=PolicyAction.DENY, reason="only a's")

        no_match = evaluate(tenant_a.pk, facts(), {"paths": ["a" * 5000 + "!"]})
        match = evaluate(tenant_a.pk, facts(), {"paths": ["a" * 5000]})

        assert no_match.action == PolicyAction.ALLOW
        assert (match.action, match.reason) == (PolicyAction.DENY, "only a's")

    def test_negate_inverts_a_catastrophic_pattern_too(self, tenant_a):
        conditions = [{"path": "paths[*]", "regex": CATASTROPHIC, "negate": True}]
        rule(tenant_a, argument_conditions=conditions, action=PolicyAction.DENY)

        assert evaluate(tenant_a.pk, facts(), {"paths": ["a" * 5000 + "!"]}).action == PolicyAction.DENY

    def test_the_compiled_condition_is_an_re2_pattern(self):
        [(_, pattern, _)] = compile_conditions([{"path": "paths[*]", "regex": "^drafts/"}])

        assert type(pattern).__module__.startswith("re2")

    @pytest.mark.parametrize("regex", [r"(a)\1", r"^(?=drafts/)", r"(?<!x)y", r"(?P<n>a)(?P=n)"], ids=str)
    def test_a_pattern_re2_cannot_run_is_a_validation_error(self, tenant_a, regex):
        policy = ApprovalPolicy.objects.create(tenant=tenant_a, name="p")
        candidate = ApprovalRule(
            tenant=tenant_a, policy=policy, argument_conditions=[{"path": "paths[*]", "regex": regex}]
        )

        with pytest.raises(ValidationError) as caught:
            candidate.full_clean()

        message = str(caught.value.message_dict["argument_conditions"])
        assert "invalid regex" in message and "RE2" in message

    def test_a_stored_pattern_re2_refuses_fails_closed(self, tenant_a):
        # Written around clean() (e.g. by an old version that compiled with Python's re).
        stored = rule(
            tenant_a, argument_conditions=[{"path": "paths[*]", "regex": r"(a)\1"}], action=PolicyAction.ALLOW
        )

        verdict = evaluate(tenant_a.pk, facts(), {"paths": ["aa"]})

        assert verdict.action == PolicyAction.REQUIRE_APPROVAL
        assert f"rule {stored.pk} has an invalid condition" in verdict.reason

    def test_the_admin_form_refuses_a_backreference(self, owner_a, tenant_a):
        client = Client()
        client.force_login(owner_a)
        data = add_form(
            tenant_a,
            {
                "argument_conditions": json.dumps([{"path": "paths[*]", "regex": r"(a)\1"}]),
                "action": PolicyAction.DENY,
                "deciders": "{}",
            },
            name="Backrefs",
        )

        response = client.post("/admin/approvals_app/approvalpolicy/add/", data)

        assert response.status_code == 200
        errors = response.context["inline_admin_formsets"][0].formset.errors[0]
        assert "invalid escape sequence" in str(errors["argument_conditions"])
        assert not ApprovalPolicy.objects.filter(name="Backrefs").exists()


# --- "Test a call" uses the catalog's facts ----------------------------------------------------------


@pytest.mark.django_db
class TestCallUsesTheCatalog:
    @pytest.fixture
    def admin_client(self, owner_a):
        client = Client()
        client.force_login(owner_a)
        return client

    def post(self, client, tenant, name, arguments=None, **typed):
        data = {"tenant": tenant.pk, "name": name, "arguments": json.dumps(arguments or {}), **typed}
        return client.post(TEST_URL, data)

    def test_the_risk_is_the_catalogs_not_what_the_admin_types(self, admin_client, tenant_a):
        rule(tenant_a, risk="destructive", action=PolicyAction.DENY, reason="no deletes")

        response = self.post(admin_client, tenant_a, "fs_delete_files", {"paths": ["a"]}, risk="read")

        assert response.status_code == 200
        assert response.context["facts"].risk == "destructive"
        assert response.context["verdict"].action == PolicyAction.DENY
        assert "risk destructive" in response.content.decode()

    def test_an_admin_who_re_risks_a_tool_sees_the_new_verdict(self, admin_client, tenant_a):
        rule(tenant_a, risk="destructive", action=PolicyAction.DENY)
        Tool.objects.filter(tenant=None, name="fs_delete_files").update(risk="read")

        response = self.post(admin_client, tenant_a, "fs_delete_files", {"paths": ["a"]})

        assert response.context["verdict"].action == PolicyAction.ALLOW

    def test_tool_sets_are_the_tenants_own(self, admin_client, tenant_a, tenant_b):
        delete = Tool.objects.get(tenant=None, name="fs_delete_files")
        ToolSet.objects.create(tenant=tenant_b, name="bravo-purge").tools.add(delete)
        ToolSet.objects.create(tenant=tenant_a, name="cleanup").tools.add(delete)
        rule(tenant_a, toolset="cleanup", action=PolicyAction.DENY, reason="no cleanup")

        response = self.post(admin_client, tenant_a, "fs_delete_files", {"paths": ["a"]})

        assert response.context["facts"].toolsets == ("cleanup",)  # not tenant B's tool set
        assert response.context["verdict"].reason == "no cleanup"

    def test_an_mcp_tool_is_matched_by_server_and_remote_name(self, admin_client, tenant_a):
        server = MCPServer.objects.create(
            tenant=tenant_a, name="crm", transport="streamable_http", url="https://crm.example/mcp"
        )
        Tool.objects.create(
            tenant=tenant_a,
            name="crm__wipe",
            source="mcp",
            mcp_server=server,
            remote_name="wipe",
            risk="external",
        )
        rule(tenant_a, tool_glob="mcp:crm:wipe", action=PolicyAction.DENY)

        response = self.post(admin_client, tenant_a, "crm__wipe")

        found = response.context["facts"]
        assert (found.source, found.risk, found.server, found.remote_name) == (
            "mcp",
            "external",
            "crm",
            "wipe",
        )
        assert response.context["verdict"].action == PolicyAction.DENY

    def test_an_unknown_tool_is_a_form_error(self, admin_client, tenant_a):
        response = self.post(admin_client, tenant_a, "no_such_tool")

        assert response.context["verdict"] is None
        assert "has no tool named 'no_such_tool'" in response.context["form"].errors["name"][0]

    def test_another_tenants_tool_is_unknown(self, admin_client, tenant_a, tenant_b):
        Tool.objects.create(tenant=tenant_b, name="bravo_secret_tool", risk="external")

        response = self.post(admin_client, tenant_a, "bravo_secret_tool")

        assert "name" in response.context["form"].errors

    def test_the_view_and_the_runtime_use_the_same_facts(self, tenant_a):
        delete = Tool.objects.get(tenant=None, name="fs_delete_files")
        ToolSet.objects.create(tenant=tenant_a, name="cleanup").tools.add(delete)

        runtime_tool = resolve_available(tenant_a.pk, ["fs_delete_files"], ["cleanup"])["fs_delete_files"]

        assert approvals.call_facts(runtime_tool) == tool_facts(tenant_a.pk, "fs_delete_files")


# --- a deny's reason reaches the model and the tool card ---------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_deny_rule_reason_reaches_the_model_and_the_tool_card(
    tenant_a, owner_a, model_config_a, model_server
):
    ToolSet.objects.create(tenant=tenant_a, name="cleanup", is_default=True).tools.add(
        Tool.objects.get(tenant=None, name="fs_delete_files")
    )
    rule(tenant_a, tool_glob="fs_delete_files", action=PolicyAction.DENY, reason=NEVER)
    session = new_session(tenant_a, owner_a)
    (engine.workspace_path(session) / "customers.csv").write_text("alice,bob")
    model_server.script(
        "agent",
        tool_reply([tool_call("fs_delete_files", {"paths": ["customers.csv"]}, id="del")]),
        text_reply("I may not delete it."),
    )

    send(session, "delete the customer list")
    drive_until_idle(session)

    assert (engine.workspace_path(session) / "customers.csv").exists()
    assert session.status == "idle"
    second = model_server.requests_for("agent")[1]
    [result] = [m for m in second.messages if m["role"] == "tool" and m.get("tool_call_id") == "del"]
    assert NEVER in result["content"]
    ended = SessionEvent.objects.get(session=session, type="tool.ended", data__call_id="del")
    assert ended.data["ok"] is False and NEVER in ended.data["summary"]
    stored = Message.objects.get(session=session, role="tool", tool_call_id="del")
    assert stored.is_error and NEVER in stored.content
    assert_tool_pairs(session)
