"""Approval policy admin: a tenant admin (owner_a, staff, not superuser) manages only tenant A's
policies and rules, gets a form error for an unusable rule, and tests calls only against A."""

import json

import pytest
from django.test import Client

from approvals_app.choices import PolicyAction
from approvals_app.policy import ensure_default_policy
from approvals_app.policy_models import ApprovalPolicy, ApprovalRule

ADMIN = "/admin/approvals_app"
TEST_URL = f"{ADMIN}/approvalpolicy/test/"


@pytest.fixture
def tenant_admin(owner_a):
    assert owner_a.is_staff and not owner_a.is_superuser, "owner_a is the tenant admin persona"
    client = Client()
    client.force_login(owner_a)
    return client


@pytest.fixture
def policies(tenant_a, tenant_b, outsider_b):
    policy_b = ApprovalPolicy.objects.create(tenant=tenant_b, name="bravo-lockdown")
    ApprovalRule.objects.create(tenant=tenant_b, policy=policy_b, tool_glob="fs_*", action=PolicyAction.DENY)
    return {"a": ensure_default_policy(tenant_a), "b": policy_b}


def add_form(tenant, rule: dict, name="Drafts only") -> dict:
    data = {
        "tenant": tenant.pk,
        "name": name,
        "description": "",
        "priority": 10,
        "enabled": "on",
        "rules-TOTAL_FORMS": 1,
        "rules-INITIAL_FORMS": 0,
        "rules-MIN_NUM_FORMS": 0,
        "rules-MAX_NUM_FORMS": 1000,
        "rules-0-position": 1,
        "rules-0-enabled": "on",
        "rules-0-tool_glob": "fs_*",
        "rules-0-toolset": "",
        "rules-0-risk": "",
        "rules-0-source": "",
        "rules-0-argument_conditions": "[]",
        "rules-0-action": PolicyAction.REQUIRE_APPROVAL,
        "rules-0-deciders": json.dumps({"session_owner": True, "tenant_admins": True, "roles": []}),
        "rules-0-expires_after_hours": 24,
        "rules-0-reason": "Outside drafts/ needs a look.",
    }
    data.update({f"rules-0-{key}": value for key, value in rule.items()})
    return data


class TestPolicyChangelist:
    def test_it_lists_only_tenant_a_policies(self, tenant_admin, policies):
        response = tenant_admin.get(f"{ADMIN}/approvalpolicy/")

        assert response.status_code == 200
        assert list(response.context["cl"].result_list) == [policies["a"]]
        assert "bravo" not in response.content.decode().lower()

    def test_it_links_to_the_test_view(self, tenant_admin, policies):
        response = tenant_admin.get(f"{ADMIN}/approvalpolicy/")

        assert f'href="{TEST_URL}"' in response.content.decode()

    def test_tenant_b_policy_page_is_not_reachable(self, tenant_admin, policies):
        response = tenant_admin.get(f"{ADMIN}/approvalpolicy/{policies['b'].pk}/change/")

        assert response.status_code in (302, 404)

    def test_the_change_page_shows_the_rules_inline(self, tenant_admin, policies):
        response = tenant_admin.get(f"{ADMIN}/approvalpolicy/{policies['a'].pk}/change/")

        assert response.status_code == 200
        html = response.content.decode()
        assert "Destructive action: a person must approve it." in html
        assert "bravo" not in html.lower()


class TestPolicyAddForm:
    def test_it_offers_only_tenant_a(self, tenant_admin, policies, tenant_a):
        response = tenant_admin.get(f"{ADMIN}/approvalpolicy/add/")

        assert response.status_code == 200
        assert list(response.context["adminform"].form.fields["tenant"].queryset) == [tenant_a]

    def test_it_adds_a_policy_with_an_inline_rule_in_tenant_a(self, tenant_admin, policies, tenant_a):
        conditions = [{"path": "$.paths[*]", "regex": "^drafts/", "negate": True}]

        response = tenant_admin.post(
            f"{ADMIN}/approvalpolicy/add/",
            add_form(tenant_a, {"argument_conditions": json.dumps(conditions)}),
        )

        assert response.status_code == 302, response.context and response.context["errors"]
        policy = ApprovalPolicy.objects.get(name="Drafts only")
        rule = policy.rules.get()
        assert (policy.tenant, rule.tenant) == (tenant_a, tenant_a)
        assert rule.argument_conditions == conditions
        assert rule.expires_after_hours == 24

    def test_an_invalid_regex_is_a_form_error(self, tenant_admin, policies, tenant_a):
        conditions = [{"path": "paths[*]", "regex": "([unclosed"}]

        response = tenant_admin.post(
            f"{ADMIN}/approvalpolicy/add/",
            add_form(tenant_a, {"argument_conditions": json.dumps(conditions)}),
        )

        assert response.status_code == 200
        inline_errors = response.context["inline_admin_formsets"][0].formset.errors
        assert "argument_conditions" in inline_errors[0]
        assert "invalid regex" in str(inline_errors[0]["argument_conditions"])
        assert not ApprovalPolicy.objects.filter(name="Drafts only").exists()

    def test_posting_tenant_b_is_refused(self, tenant_admin, policies, tenant_b):
        response = tenant_admin.post(f"{ADMIN}/approvalpolicy/add/", add_form(tenant_b, {}, name="smuggled"))

        assert response.status_code == 200
        assert "tenant" in response.context["adminform"].form.errors
        assert not ApprovalPolicy.objects.filter(name="smuggled").exists()

    def test_a_rule_added_to_an_existing_policy_takes_its_tenant(self, tenant_admin, policies, tenant_a):
        policy = policies["a"]
        existing = list(policy.rules.all())
        data = {
            "tenant": tenant_a.pk,
            "name": policy.name,
            "description": policy.description,
            "priority": policy.priority,
            "enabled": "on",
            "rules-TOTAL_FORMS": len(existing) + 1,
            "rules-INITIAL_FORMS": len(existing),
            "rules-MIN_NUM_FORMS": 0,
            "rules-MAX_NUM_FORMS": 1000,
        }
        for index, rule in enumerate(existing):
            data.update(
                {
                    f"rules-{index}-id": rule.pk,
                    f"rules-{index}-policy": policy.pk,
                    f"rules-{index}-position": rule.position,
                    f"rules-{index}-enabled": "on",
                    f"rules-{index}-risk": rule.risk,
                    f"rules-{index}-argument_conditions": "[]",
                    f"rules-{index}-action": rule.action,
                    f"rules-{index}-deciders": json.dumps(rule.deciders),
                    f"rules-{index}-expires_after_hours": rule.expires_after_hours,
                    f"rules-{index}-reason": rule.reason,
                }
            )
        new = len(existing)
        data.update(
            {
                f"rules-{new}-policy": policy.pk,
                f"rules-{new}-position": 99,
                f"rules-{new}-enabled": "on",
                f"rules-{new}-tool_glob": "shell_*",
                f"rules-{new}-argument_conditions": "[]",
                f"rules-{new}-action": PolicyAction.DENY,
                f"rules-{new}-deciders": "{}",
            }
        )

        response = tenant_admin.post(f"{ADMIN}/approvalpolicy/{policy.pk}/change/", data)

        assert response.status_code == 302, response.context and response.context["errors"]
        added = policy.rules.get(tool_glob="shell_*")
        assert added.tenant == tenant_a


class TestStructuredRuleEditor:
    """Rules are edited in plain fields (issue #27): condition rows, decider checkboxes, suggested
    tool and tool set names; the JSON only behind "Advanced"."""

    @staticmethod
    def structured(rule: dict, conditions=(), deciders=("session_owner", "tenant_admins")) -> dict:
        """The add form as the browser posts it: the JSON inputs are the advanced ones."""
        data = {
            "rules-0-argument_conditions__structured": "1",
            "rules-0-argument_conditions": "[]",
            "rules-0-deciders__structured": "1",
            "rules-0-deciders": "{}",
            **{f"rules-0-deciders__{flag}": "on" for flag in deciders},
            **rule,
        }
        for index, (path, regex, negate) in enumerate([*conditions, ("", "", False)]):
            data[f"rules-0-argument_conditions__path_{index}"] = path
            data[f"rules-0-argument_conditions__regex_{index}"] = regex
            if negate:
                data[f"rules-0-argument_conditions__negate_{index}"] = "on"
        return data

    def post(self, client, tenant, fields: dict):
        data = add_form(tenant, {})
        del data["rules-0-argument_conditions"], data["rules-0-deciders"]
        data.update(fields)
        return client.post(f"{ADMIN}/approvalpolicy/add/", data)

    def test_the_page_offers_fields_not_json(self, tenant_admin, policies, tenant_a, tenant_b):
        from tools_app.models import Tool, ToolSet

        Tool.objects.create(tenant=tenant_a, name="acme_crm_lookup")
        Tool.objects.create(tenant=tenant_b, name="bravo_secret_tool")
        ToolSet.objects.create(tenant=tenant_a, name="acme_crm")

        page = tenant_admin.get(f"{ADMIN}/approvalpolicy/add/").content.decode()

        assert 'data-testid="condition-rows"' in page and 'data-testid="decider-choices"' in page
        assert 'name="rules-0-argument_conditions__path_0"' in page
        assert 'name="rules-0-deciders__session_owner" checked' in page
        assert 'name="rules-0-deciders__role_member">' in page
        assert page.count("<summary>Advanced: JSON</summary>") >= 2
        tool_list = page.split('<datalist id="approval-tool-names">')[1].split("</datalist>")[0]
        assert '"fs_delete_files"' in tool_list and '"acme_crm_lookup"' in tool_list
        assert "bravo_secret_tool" not in page
        assert '<option value="acme_crm">' in page.split('id="approval-toolset-names"')[1]
        assert 'list="approval-tool-names"' in page

    def test_rows_and_checkboxes_are_stored_as_the_rules_json(self, tenant_admin, policies, tenant_a):
        fields = self.structured(
            {},
            conditions=[("paths[*]", "^drafts/", True), ("mode", "^overwrite$", False)],
            deciders=("tenant_admins", "role_member"),
        )

        response = self.post(tenant_admin, tenant_a, fields)

        assert response.status_code == 302, response.context and response.context["errors"]
        rule = ApprovalPolicy.objects.get(name="Drafts only").rules.get()
        assert rule.argument_conditions == [
            {"path": "paths[*]", "regex": "^drafts/", "negate": True},
            {"path": "mode", "regex": "^overwrite$"},
        ]
        assert rule.deciders == {"session_owner": False, "tenant_admins": True, "roles": ["member"]}

    def test_a_half_filled_row_is_an_error_that_keeps_what_was_typed(self, tenant_admin, policies, tenant_a):
        fields = self.structured({}, conditions=[("paths[*]", "", False)])

        response = self.post(tenant_admin, tenant_a, fields)

        assert response.status_code == 200
        errors = response.context["inline_admin_formsets"][0].formset.errors[0]
        assert errors["argument_conditions"] == ["condition 1 needs a non-empty 'regex'"]
        assert 'name="rules-0-argument_conditions__path_0" value="paths[*]"' in response.content.decode()
        assert not ApprovalPolicy.objects.filter(name="Drafts only").exists()

    def test_nobody_to_decide_is_an_error(self, tenant_admin, policies, tenant_a):
        response = self.post(tenant_admin, tenant_a, self.structured({}, deciders=()))

        errors = response.context["inline_admin_formsets"][0].formset.errors[0]
        assert "At least one kind of person must be able to decide." in str(errors["deciders"])

    def test_the_advanced_json_is_used_when_ticked(self, tenant_admin, policies, tenant_a):
        conditions = [{"path": "paths.0", "regex": "secret"}]
        fields = self.structured({}, conditions=[("ignored", "x", False)])
        fields["rules-0-argument_conditions"] = json.dumps(conditions)
        fields["rules-0-argument_conditions__as_json"] = "on"

        assert self.post(tenant_admin, tenant_a, fields).status_code == 302
        assert ApprovalPolicy.objects.get(name="Drafts only").rules.get().argument_conditions == conditions

    def test_too_many_rows_are_an_error_not_cut(self, tenant_admin, policies, tenant_a):
        fields = self.structured({}, conditions=[("paths[*]", f"^d{i}/", False) for i in range(60)])

        response = self.post(tenant_admin, tenant_a, fields)

        errors = response.context["inline_admin_formsets"][0].formset.errors[0]
        assert "at most 50 argument conditions" in str(errors["argument_conditions"])

    @pytest.mark.parametrize("field", ["argument_conditions", "deciders"])
    def test_json_nested_past_the_limit_is_a_form_error_not_a_500(
        self, tenant_admin, policies, tenant_a, field
    ):
        data = add_form(tenant_a, {field: "[" * 5000 + "]" * 5000})

        response = tenant_admin.post(f"{ADMIN}/approvalpolicy/add/", data)

        assert response.status_code == 200
        errors = response.context["inline_admin_formsets"][0].formset.errors[0]
        assert "nested deeper than" in str(errors[field])

    def test_a_stored_rule_shows_in_its_fields(self, tenant_admin, policies):
        policy = policies["a"]
        ApprovalRule.objects.create(
            tenant=policy.tenant,
            policy=policy,
            position=50,
            argument_conditions=[{"path": "paths[*]", "regex": "^keep/", "negate": True}],
            deciders={"session_owner": True, "tenant_admins": False, "roles": ["admin"]},
        )

        page = tenant_admin.get(f"{ADMIN}/approvalpolicy/{policy.pk}/change/").content.decode()

        assert 'value="^keep/"' in page
        assert '__negate_0" checked> must not match' in page
        assert '__role_admin" checked>' in page


class TestCallView:
    def call(self, tenant, **overrides):
        data = {
            "tenant": tenant.pk,
            "name": "fs_delete_files",
            "arguments": json.dumps({"paths": ["drafts/a.md"]}),
        }
        data.update(overrides)
        return data

    def test_it_shows_the_matching_rule(self, tenant_admin, policies, tenant_a):
        destructive = policies["a"].rules.get(risk="destructive")

        response = tenant_admin.post(TEST_URL, self.call(tenant_a))

        assert response.status_code == 200
        verdict = response.context["verdict"]
        assert verdict.action == PolicyAction.REQUIRE_APPROVAL
        assert verdict.rule["id"] == destructive.pk
        html = response.content.decode()
        assert "Verdict: require_approval" in html
        assert f"#{destructive.pk} in policy" in html
        assert "Destructive action: a person must approve it." in html
        assert "72 h" in html

    def test_a_call_no_rule_matches_is_allowed(self, tenant_admin, policies, tenant_a):
        response = tenant_admin.post(TEST_URL, self.call(tenant_a, name="fs_read", arguments='{"path": "a"}'))

        verdict = response.context["verdict"]
        assert (verdict.action, verdict.rule, verdict.reason) == ("allow", None, "no rule matched")

    def test_it_offers_only_tenant_a(self, tenant_admin, policies, tenant_a):
        response = tenant_admin.get(TEST_URL)

        assert response.status_code == 200
        assert list(response.context["form"].fields["tenant"].queryset) == [tenant_a]
        assert "bravo" not in response.content.decode().lower()

    def test_it_will_not_evaluate_tenant_b(self, tenant_admin, policies, tenant_b):
        response = tenant_admin.post(TEST_URL, self.call(tenant_b, name="fs_write"))

        assert response.status_code == 200
        assert response.context["verdict"] is None
        assert "tenant" in response.context["form"].errors
        assert "bravo-lockdown" not in response.content.decode()

    def test_arguments_must_be_an_object(self, tenant_admin, policies, tenant_a):
        response = tenant_admin.post(TEST_URL, self.call(tenant_a, arguments="[1, 2]"))

        assert response.context["verdict"] is None
        assert "arguments" in response.context["form"].errors

    def test_a_member_cannot_use_it(self, member_a, policies):
        client = Client()
        client.force_login(member_a)

        response = client.get(TEST_URL)

        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")


class TestPendingApprovalAdmin:
    @pytest.fixture
    def approvals(self, tenant_a, tenant_b):
        from approvals_app.models import PendingApproval

        def make(tenant, tool):
            return PendingApproval.objects.create(
                tenant=tenant,
                session_id=f"00000000-0000-0000-0000-{tenant.pk:012d}",
                turn_id=1,
                assistant_message_id=1,
                call_id=f"call-{tool}",
                tool=tool,
                risk="destructive",
                reason="Destructive action: a person must approve it.",
            )

        return {"a": make(tenant_a, "fs_delete_files"), "b": make(tenant_b, "bravo_secret_tool")}

    def test_it_lists_only_tenant_a_read_only(self, tenant_admin, approvals):
        response = tenant_admin.get(f"{ADMIN}/pendingapproval/")

        assert response.status_code == 200
        assert list(response.context["cl"].result_list) == [approvals["a"]]
        assert "bravo_secret_tool" not in response.content.decode()
        assert tenant_admin.get(f"{ADMIN}/pendingapproval/add/").status_code == 403
        detail = tenant_admin.get(f"{ADMIN}/pendingapproval/{approvals['a'].pk}/change/")
        assert detail.status_code == 200
        assert not detail.context["has_change_permission"]
        assert tenant_admin.get(f"{ADMIN}/pendingapproval/{approvals['a'].pk}/delete/").status_code == 403

    def test_it_lists_pending_ones_by_default_and_counts_them(self, tenant_admin, approvals, tenant_a):
        from approvals_app.models import PendingApproval

        decided = PendingApproval.objects.create(
            tenant=tenant_a,
            session_id=approvals["a"].session_id,
            turn_id=2,
            assistant_message_id=2,
            call_id="call-decided",
            tool="fs_write",
            risk="write",
            status="approved",
        )

        pending = tenant_admin.get(f"{ADMIN}/pendingapproval/")
        assert list(pending.context["cl"].result_list) == [approvals["a"]]
        assert pending.context["cl"].result_count == 1
        every = tenant_admin.get(f"{ADMIN}/pendingapproval/?status=all")
        assert sorted(a.pk for a in every.context["cl"].result_list) == sorted(
            [approvals["a"].pk, decided.pk]
        )
        approved = tenant_admin.get(f"{ADMIN}/pendingapproval/?status=approved")
        assert list(approved.context["cl"].result_list) == [decided]


def test_the_test_a_call_example_is_a_real_tool_with_valid_arguments():
    from jsonschema import Draft202012Validator

    from approvals_app.admin import EXAMPLE_ARGUMENTS, EXAMPLE_TOOL
    from tools_app.registry import NATIVE_TOOLS

    assert EXAMPLE_TOOL in NATIVE_TOOLS
    Draft202012Validator(NATIVE_TOOLS[EXAMPLE_TOOL].input_schema).validate(EXAMPLE_ARGUMENTS)
