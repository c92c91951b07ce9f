"""Approval policy matching (ARCHITECTURE §2): table tests over every match field, deny-wins
ordering, tenant isolation, fail-closed conditions, the seeded Default policy and `can_decide`."""

import pytest
from django.core.exceptions import ValidationError

from approvals_app.choices import PolicyAction
from approvals_app.policy import CallFacts, can_decide, ensure_default_policy, evaluate
from approvals_app.policy_models import ApprovalPolicy, ApprovalRule, parse_path
from tenancy_app.choices import Role

ALLOW, REQUIRE, DENY = PolicyAction.ALLOW, PolicyAction.REQUIRE_APPROVAL, PolicyAction.DENY

FS_WRITE = CallFacts(name="fs_write_file", source="native", risk="write", toolsets=("filesystem",))
FS_DELETE = CallFacts(name="fs_delete_files", source="native", risk="destructive", toolsets=("filesystem",))
SHELL = CallFacts(name="shell_exec", source="native", risk="external", toolsets=("shell",))
MCP_ADD = CallFacts(name="example__add", source="mcp", risk="read", server="example", remote_name="add")
MCP_OTHER = CallFacts(name="other__add", source="mcp", risk="read", server="other", remote_name="add")

OUTSIDE_DRAFTS = {"path": "$.paths[*]", "regex": "^drafts/", "negate": True}


def policy_for(tenant, name="Team", **fields):
    return ApprovalPolicy.objects.create(tenant=tenant, name=name, **fields)


def rule_for(policy, **fields):
    fields.setdefault("action", DENY)
    return ApprovalRule.objects.create(tenant=policy.tenant, policy=policy, **fields)


MATCHING = [
    # (id, rule fields, call, arguments, matches)
    ("glob fs_* matches fs_write", {"tool_glob": "fs_*"}, FS_WRITE, {}, True),
    ("glob fs_* skips shell_exec", {"tool_glob": "fs_*"}, SHELL, {}, False),
    ("glob is case-sensitive", {"tool_glob": "FS_*"}, FS_WRITE, {}, False),
    ("glob mcp:example:* matches its server", {"tool_glob": "mcp:example:*"}, MCP_ADD, {}, True),
    ("glob mcp:example:* skips other server", {"tool_glob": "mcp:example:*"}, MCP_OTHER, {}, False),
    ("glob mcp:<server>:<tool> exact", {"tool_glob": "mcp:example:add"}, MCP_ADD, {}, True),
    ("glob mcp: never matches native", {"tool_glob": "mcp:*"}, FS_WRITE, {}, False),
    ("glob *__add matches model-facing name", {"tool_glob": "*__add"}, MCP_OTHER, {}, True),
    ("blank rule matches any call", {}, SHELL, {}, True),
    ("risk equal", {"risk": "destructive"}, FS_DELETE, {}, True),
    ("risk different", {"risk": "destructive"}, FS_WRITE, {}, False),
    ("source mcp matches mcp", {"source": "mcp"}, MCP_ADD, {}, True),
    ("source mcp skips native", {"source": "mcp"}, FS_WRITE, {}, False),
    ("source native", {"source": "native"}, SHELL, {}, True),
    ("toolset member", {"toolset": "filesystem"}, FS_DELETE, {}, True),
    ("toolset non-member", {"toolset": "filesystem"}, SHELL, {}, False),
    ("all fields must hold", {"tool_glob": "fs_*", "risk": "destructive"}, FS_WRITE, {}, False),
    ("path outside drafts/", {"argument_conditions": [OUTSIDE_DRAFTS]}, FS_WRITE, {"paths": ["etc/x"]}, True),
    (
        "paths inside drafts/",
        {"argument_conditions": [OUTSIDE_DRAFTS]},
        FS_WRITE,
        {"paths": ["drafts/a.md", "drafts/b.md"]},
        False,
    ),
    (
        "[*]: any element outside drafts/ is enough",
        {"argument_conditions": [OUTSIDE_DRAFTS]},
        FS_WRITE,
        {"paths": ["drafts/a.md", "src/main.py"]},
        True,
    ),
    (
        "[*]: any element matching (not negated)",
        {"argument_conditions": [{"path": "paths[*]", "regex": r"\.env$"}]},
        FS_WRITE,
        {"paths": ["a.txt", "config/.env"]},
        True,
    ),
    (
        "[*] over an empty list never holds",
        {"argument_conditions": [OUTSIDE_DRAFTS]},
        FS_WRITE,
        {"paths": []},
        False,
    ),
    ("missing path never holds", {"argument_conditions": [OUTSIDE_DRAFTS]}, FS_WRITE, {"other": 1}, False),
    (
        "missing path never holds, not negated",
        {"argument_conditions": [{"path": "path", "regex": ".*"}]},
        FS_WRITE,
        {},
        False,
    ),
    (
        "dotted index paths.0",
        {"argument_conditions": [{"path": "paths.0", "regex": "^secret/"}]},
        FS_WRITE,
        {"paths": ["secret/k", "a"]},
        True,
    ),
    (
        "dotted index paths.1 out of range",
        {"argument_conditions": [{"path": "paths[1]", "regex": ".*"}]},
        FS_WRITE,
        {"paths": ["a"]},
        False,
    ),
    (
        "nested key",
        {"argument_conditions": [{"path": "$.options.mode", "regex": "^force$"}]},
        SHELL,
        {"options": {"mode": "force"}},
        True,
    ),
    (
        "non-string value as JSON text",
        {"argument_conditions": [{"path": "recursive", "regex": "^true$"}]},
        FS_DELETE,
        {"recursive": True},
        True,
    ),
    (
        "all conditions must hold",
        {"argument_conditions": [OUTSIDE_DRAFTS, {"path": "mode", "regex": "^overwrite$"}]},
        FS_WRITE,
        {"paths": ["src/a"], "mode": "append"},
        False,
    ),
    (
        "plain negate on a single value",
        {"argument_conditions": [{"path": "command", "regex": "^ls\\b", "negate": True}]},
        SHELL,
        {"command": "rm -rf /"},
        True,
    ),
]


@pytest.mark.parametrize(
    ("rule_fields", "facts", "arguments", "matches"),
    [case[1:] for case in MATCHING],
    ids=[c[0] for c in MATCHING],
)
def test_it_matches_calls(tenant_a, rule_fields, facts, arguments, matches):
    rule = rule_for(policy_for(tenant_a), **rule_fields)

    verdict = evaluate(tenant_a.pk, facts, arguments)

    if matches:
        assert (verdict.action, verdict.rule["id"]) == (DENY, rule.pk)
    else:
        assert (verdict.action, verdict.rule, verdict.reason) == (ALLOW, None, "no rule matched")


ORDERING = [
    # (id, [(policy, policy priority, rule position, action)], expected action, index of the winning rule)
    ("allow first, deny later: deny wins", [("p", 1, 1, ALLOW), ("p", 1, 2, DENY)], DENY, 1),
    ("require vs allow: require wins", [("p", 1, 1, ALLOW), ("p", 1, 2, REQUIRE)], REQUIRE, 1),
    ("deny in a later policy beats require", [("p", 1, 1, REQUIRE), ("q", 9, 1, DENY)], DENY, 1),
    ("among equals the earlier policy", [("p", 9, 1, REQUIRE), ("q", 1, 5, REQUIRE)], REQUIRE, 1),
    ("among equals the earlier position", [("p", 1, 7, REQUIRE), ("p", 1, 3, REQUIRE)], REQUIRE, 1),
    ("only allow", [("p", 1, 1, ALLOW)], ALLOW, 0),
]


@pytest.mark.parametrize(
    ("rows", "action", "winner"), [c[1:] for c in ORDERING], ids=[c[0] for c in ORDERING]
)
def test_deny_wins_over_require_over_allow(tenant_a, rows, action, winner):
    rules = []
    for number, (name, priority, position, rule_action) in enumerate(rows):
        policy, _ = ApprovalPolicy.objects.get_or_create(
            tenant=tenant_a, name=name, defaults={"priority": priority}
        )
        rules.append(rule_for(policy, position=position, action=rule_action, reason=f"rule {number}"))

    verdict = evaluate(tenant_a.pk, FS_WRITE, {})

    assert verdict.action == action
    assert verdict.rule["id"] == rules[winner].pk
    assert verdict.reason == f"rule {winner}"


def test_it_ignores_disabled_rules_and_policies(tenant_a):
    rule_for(policy_for(tenant_a, name="off", enabled=False), action=DENY)
    rule_for(policy_for(tenant_a, name="on"), action=DENY, enabled=False)

    assert evaluate(tenant_a.pk, FS_WRITE, {}).action == ALLOW


def test_another_tenants_policies_never_apply(tenant_a, tenant_b):
    rule_for(policy_for(tenant_b), action=DENY)

    assert evaluate(tenant_a.pk, FS_WRITE, {}).action == ALLOW
    assert evaluate(tenant_b.pk, FS_WRITE, {}).action == DENY


def test_a_rule_with_a_foreign_tenant_row_is_never_used(tenant_a, tenant_b):
    # Even a rule row smuggled under another tenant's policy (bypassing save) is not evaluated for it.
    policy_b = policy_for(tenant_b)
    ApprovalRule.objects.bulk_create([ApprovalRule(tenant=tenant_a, policy=policy_b, action=DENY)])

    assert evaluate(tenant_a.pk, FS_WRITE, {}).action == ALLOW


def test_it_evaluates_in_one_query(tenant_a, django_assert_num_queries):
    for number in range(3):
        rule_for(policy_for(tenant_a, name=f"p{number}"), tool_glob="fs_*", action=REQUIRE)

    with django_assert_num_queries(1):
        assert evaluate(tenant_a.pk, FS_WRITE, {}).action == REQUIRE


@pytest.mark.parametrize(
    "conditions",
    [
        [{"path": "paths[*]", "regex": "([unclosed"}],
        [{"path": "paths[*", "regex": "x"}],
        [{"regex": "x"}],
        {"path": "paths", "regex": "x"},
        ["not an object"],
    ],
    ids=["bad regex", "bad path", "no path", "not a list", "not an object"],
)
def test_an_invalid_condition_fails_closed(tenant_a, conditions):
    policy = policy_for(tenant_a)
    allow = rule_for(policy, position=1, action=ALLOW)
    # Stored without clean(), as a raw update or an old row would be.
    broken = ApprovalRule.objects.create(
        tenant=tenant_a,
        policy=policy,
        position=2,
        tool_glob="fs_*",
        action=ALLOW,
        argument_conditions=conditions,
    )

    verdict = evaluate(tenant_a.pk, FS_WRITE, {"paths": ["x"]})
    unrelated = evaluate(tenant_a.pk, SHELL, {"paths": ["x"]})

    assert verdict.action == REQUIRE
    assert verdict.rule["id"] == broken.pk
    assert f"rule {broken.pk} has an invalid condition" in verdict.reason
    assert (unrelated.action, unrelated.rule["id"]) == (ALLOW, allow.pk), "only where its other fields match"


@pytest.mark.parametrize(
    ("conditions", "deciders", "field"),
    [
        ([{"path": "paths[*]", "regex": "([unclosed"}], None, "argument_conditions"),
        ([{"path": "paths[", "regex": "x"}], None, "argument_conditions"),
        ([{"path": "p", "regex": "x", "negate": "yes"}], None, "argument_conditions"),
        ([{"path": "p", "regex": "x", "typo": 1}], None, "argument_conditions"),
        ([], {"session_owner": False, "tenant_admins": False, "roles": []}, "deciders"),
        ([], {"roles": ["superhero"]}, "deciders"),
        ([], {"owner": True}, "deciders"),
    ],
)
def test_clean_rejects_unusable_rules(tenant_a, conditions, deciders, field):
    rule = ApprovalRule(tenant=tenant_a, policy=policy_for(tenant_a), argument_conditions=conditions)
    if deciders is not None:
        rule.deciders = deciders

    with pytest.raises(ValidationError) as caught:
        rule.full_clean()

    assert field in caught.value.message_dict


def test_clean_accepts_a_good_rule(tenant_a):
    rule = ApprovalRule(
        tenant=tenant_a,
        policy=policy_for(tenant_a),
        argument_conditions=[OUTSIDE_DRAFTS],
        deciders={"session_owner": False, "roles": ["member"]},
    )

    rule.full_clean()


@pytest.mark.parametrize(
    ("path", "tokens"),
    [
        ("$.paths[*]", ("paths", None)),
        ("paths[*]", ("paths", None)),
        ("paths.*", ("paths", None)),
        ("paths.0", ("paths", "0")),
        ("paths[0]", ("paths", 0)),
        ("$.a.b-c[2].d", ("a", "b-c", 2, "d")),
    ],
)
def test_path_syntax(path, tokens):
    assert parse_path(path) == tokens


@pytest.mark.parametrize("path", ["", "$", "$.", "a..b", "a[", "a[x]", "a]b", "a[*]b"])
def test_bad_paths_are_refused(path):
    with pytest.raises(ValueError):
        parse_path(path)


def test_the_verdict_carries_expiry_deciders_and_a_rule_snapshot(tenant_a):
    policy = policy_for(tenant_a, name="Writes")
    rule = rule_for(
        policy,
        position=4,
        risk="write",
        action=REQUIRE,
        expires_after_hours=24,
        reason="Writes need a look.",
        deciders={"session_owner": False, "tenant_admins": True, "roles": ["member"]},
    )

    verdict = evaluate(tenant_a.pk, FS_WRITE, {})

    assert verdict.action == REQUIRE
    assert verdict.expires_after_hours == 24
    assert verdict.reason == "Writes need a look."
    assert verdict.deciders == {"session_owner": False, "tenant_admins": True, "roles": ["member"]}
    assert verdict.rule == {
        "id": rule.pk,
        "policy_id": policy.pk,
        "policy": "Writes",
        "position": 4,
        "label": "risk write → require_approval",
        "action": REQUIRE,
    }


class TestDefaultPolicy:
    @pytest.mark.parametrize(
        ("risk", "action"),
        [("read", ALLOW), ("write", ALLOW), ("destructive", REQUIRE), ("external", REQUIRE)],
    )
    def test_it_requires_approval_for_destructive_and_external(self, tenant_a, risk, action):
        ensure_default_policy(tenant_a)

        verdict = evaluate(tenant_a.pk, CallFacts(name="anything", source="native", risk=risk), {})

        assert verdict.action == action
        if action == REQUIRE:
            assert verdict.expires_after_hours == 72
            assert verdict.deciders == {"session_owner": True, "tenant_admins": True, "roles": []}
            assert "a person must approve it" in verdict.reason

    def test_seeding_is_idempotent(self, tenant_a):
        first = ensure_default_policy(tenant_a)
        again = ensure_default_policy(tenant_a)

        assert first.pk == again.pk
        assert ApprovalPolicy.objects.for_tenant(tenant_a).count() == 1
        assert ApprovalRule.objects.for_tenant(tenant_a).count() == 2

    def test_it_keeps_an_admins_edits(self, tenant_a):
        policy = ensure_default_policy(tenant_a)
        policy.rules.filter(risk="external").update(action=ALLOW)

        ensure_default_policy(tenant_a)

        assert evaluate(tenant_a.pk, SHELL, {}).action == ALLOW

    def test_it_seeds_per_tenant(self, tenant_a, tenant_b):
        ensure_default_policy(tenant_a)

        assert evaluate(tenant_b.pk, FS_DELETE, {}).action == ALLOW
        ensure_default_policy(tenant_b)
        assert evaluate(tenant_b.pk, FS_DELETE, {}).action == REQUIRE


OWNER_AND_ADMINS = {"session_owner": True, "tenant_admins": True, "roles": []}
ADMINS_ONLY = {"session_owner": False, "tenant_admins": True, "roles": []}
OWNER_ONLY = {"session_owner": True, "tenant_admins": False, "roles": []}
MEMBERS = {"session_owner": False, "tenant_admins": False, "roles": ["member"]}

CAN_DECIDE = [
    # (deciders, user is the session owner, role, may decide)
    (OWNER_AND_ADMINS, True, Role.MEMBER, True),
    (OWNER_AND_ADMINS, False, Role.MEMBER, False),
    (OWNER_AND_ADMINS, False, Role.ADMIN, True),
    (OWNER_AND_ADMINS, False, Role.OWNER, True),
    (ADMINS_ONLY, True, Role.MEMBER, False),
    (ADMINS_ONLY, False, Role.ADMIN, True),
    (OWNER_ONLY, False, Role.OWNER, False),
    (OWNER_ONLY, True, Role.MEMBER, True),
    (MEMBERS, False, Role.MEMBER, True),
    (MEMBERS, False, Role.ADMIN, False),
    (OWNER_AND_ADMINS, True, None, False),  # no longer a member of the tenant
    ({}, True, Role.MEMBER, True),  # empty = the default (owner + admins)
    ({}, False, Role.ADMIN, True),
    ({}, False, Role.MEMBER, False),
]


@pytest.mark.parametrize(("deciders", "is_session_owner", "role", "allowed"), CAN_DECIDE)
def test_can_decide(deciders, is_session_owner, role, allowed):
    assert (
        can_decide(deciders, user_id=7, session_owner_id=7 if is_session_owner else 8, role=role) is allowed
    )


def test_can_decide_needs_a_user():
    assert not can_decide(OWNER_AND_ADMINS, user_id=None, session_owner_id=None, role=Role.OWNER)
