"""Policy matching: what a tenant's approval policies say about one tool call, and who may decide.

Pure reads over `ApprovalPolicy` / `ApprovalRule` (approvals_app.policy_models), plus
`ensure_default_policy`, the one write: seeding a tenant's "Default" policy.

Matching (every filled field of a rule must hold; blank = any):
- tool_glob: fnmatch (case-sensitive) against the model-facing name (`fs_delete_files`,
  `example__add`) and, for MCP tools, against `mcp:<server>:<remote tool>`; either may match.
- toolset: the call's tool belongs to a tool set of that name.
- risk, source: equal to the call's.
- argument_conditions: all must hold. A condition `{"path", "regex", "negate"}` resolves `path`
  (syntax in policy_models: `$.paths[*]`, `paths.0`, `options.mode`) in the arguments to zero or
  more values; it holds if ANY resolved value matches — an RE2 (linear-time) search of `regex`
  in the value, inverted per value by `negate`. A path that resolves to nothing never holds (negated or not). Non-string
  values are matched as their JSON text (`true`, `3`, `{"a": 1}`).
  "Any path outside drafts/": `{"path": "paths[*]", "regex": "^drafts/", "negate": true}`.

Across all matches: deny > require_approval > allow; between equals the first by
(policy priority, policy id, rule position, rule id). No match: allow. A rule whose stored
conditions cannot be used (possible only if it bypassed `clean()`) fails closed: if its other
fields match, it counts as require_approval with reason "rule N has an invalid condition".

The facts of a call (risk, tool sets, source) are the tool catalog's, which lives above this app
(tools_app). The catalog registers `tool_facts` here when it loads (`register_tool_facts`), so the
admin's "Test a call" evaluates a tool by name with exactly the facts the runtime uses.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from django.db import IntegrityError, transaction

from tenancy_app import audit
from tenancy_app.choices import ADMIN_ROLES

from .choices import PolicyAction, Risk, ToolSource
from .policy_models import (
    WILDCARD,
    ApprovalPolicy,
    ApprovalRule,
    compile_conditions,
    default_deciders,
    normalize_deciders,
)

logger = logging.getLogger(__name__)

SEVERITY = {PolicyAction.ALLOW: 0, PolicyAction.REQUIRE_APPROVAL: 1, PolicyAction.DENY: 2}
NO_MATCH_REASON = "no rule matched"
DEFAULT_POLICY_NAME = "Default"
DEFAULT_EXPIRY_HOURS = 72
DEFAULT_RULES = (
    (Risk.DESTRUCTIVE, "Destructive action: a person must approve it."),
    (Risk.EXTERNAL, "External action (leaves the workspace): a person must approve it."),
)


@dataclass(frozen=True)
class CallFacts:
    """What the policy may know about a call besides its arguments."""

    name: str
    source: str
    risk: str
    toolsets: tuple[str, ...] = ()
    server: str = ""
    remote_name: str = ""

    def identifiers(self) -> tuple[str, ...]:
        if self.source == ToolSource.MCP and self.server:
            return (self.name, f"mcp:{self.server}:{self.remote_name or self.name}")
        return (self.name,)


@dataclass(frozen=True)
class Verdict:
    action: str
    rule: dict | None  # snapshot: id, policy_id, policy, position, label, action
    reason: str
    deciders: dict = field(default_factory=dict)
    expires_after_hours: int | None = None


ToolFacts = Callable[[int, str], "CallFacts | None"]
_tool_facts: ToolFacts | None = None


def register_tool_facts(provider: ToolFacts) -> None:
    """Called once by the tool catalog (tools_app.apps.ready): `provider(tenant_id, tool_name)`
    returns the CallFacts the runtime would use for that tool, or None if the tenant has no such tool."""
    global _tool_facts
    _tool_facts = provider


RuleVocabulary = Callable[[list[int]], "tuple[list[str], list[str]]"]
_rule_vocabulary: RuleVocabulary | None = None


def register_rule_vocabulary(provider: RuleVocabulary) -> None:
    """Called once by the tool catalog: `provider(tenant_ids)` returns (tool names, tool set
    names) those tenants have, global ones included — what the rule editor suggests."""
    global _rule_vocabulary
    _rule_vocabulary = provider


def rule_vocabulary(tenant_ids: list[int]) -> tuple[list[str], list[str]]:
    """(tool names, tool set names) to suggest in a rule of these tenants; empty without a catalog."""
    return _rule_vocabulary(tenant_ids) if _rule_vocabulary is not None else ([], [])


def tool_facts(tenant_id: int, tool_name: str) -> CallFacts | None:
    """The catalog's facts about a tool of this tenant (by its model-facing name), or None."""
    if _tool_facts is None:
        raise RuntimeError("no tool catalog registered its facts (is tools_app installed?)")
    return _tool_facts(tenant_id, tool_name)


def tenant_rules(tenant_id: int) -> list[ApprovalRule]:
    """The tenant's enabled rules in evaluation order (one query). A runner slice loads them
    once and re-loads when the tenant's configuration version changes."""
    return list(
        ApprovalRule.objects.filter(
            tenant_id=tenant_id, enabled=True, policy__tenant_id=tenant_id, policy__enabled=True
        )
        .select_related("policy")
        .order_by("policy__priority", "policy_id", "position", "id")
    )


def evaluate(
    tenant_id: int, facts: CallFacts, arguments: dict, rules: list[ApprovalRule] | None = None
) -> Verdict:
    """The tenant's verdict on one call: `rules` as `tenant_rules` gave them, or read now.
    Never raises for a bad stored rule."""
    if rules is None:
        rules = tenant_rules(tenant_id)
    best: tuple[int, ApprovalRule, str, str] | None = None  # (severity, rule, action, reason)
    for rule in rules:
        if not _matches_call(rule, facts):
            continue
        action, reason = rule.action, rule.reason
        try:
            conditions = compile_conditions(rule.argument_conditions)
        except ValueError as exc:
            logger.warning("approval rule %s has an invalid condition: %s", rule.pk, exc)
            action, reason = PolicyAction.REQUIRE_APPROVAL, f"rule {rule.pk} has an invalid condition: {exc}"
        else:
            if not all(_condition_holds(c, arguments) for c in conditions):
                continue
        severity = SEVERITY.get(action, SEVERITY[PolicyAction.DENY])
        if best is None or severity > best[0]:
            best = (severity, rule, action, reason)
    if best is None:
        return Verdict(action=PolicyAction.ALLOW, rule=None, reason=NO_MATCH_REASON)
    _, rule, action, reason = best
    try:
        deciders = normalize_deciders(rule.deciders)
    except ValueError:
        deciders = default_deciders()
    return Verdict(
        action=str(action),
        rule=rule_snapshot(rule),
        reason=reason or f"{rule.policy.name}: {rule.label}",
        deciders=deciders,
        expires_after_hours=rule.expires_after_hours,
    )


def rule_snapshot(rule: ApprovalRule) -> dict:
    return {
        "id": rule.pk,
        "policy_id": rule.policy_id,
        "policy": rule.policy.name,
        "position": rule.position,
        "label": rule.label,
        "action": rule.action,
    }


def _matches_call(rule: ApprovalRule, facts: CallFacts) -> bool:
    if rule.risk and rule.risk != facts.risk:
        return False
    if rule.source and rule.source != facts.source:
        return False
    if rule.toolset and rule.toolset not in facts.toolsets:
        return False
    if rule.tool_glob and not any(fnmatchcase(name, rule.tool_glob) for name in facts.identifiers()):
        return False
    return True


def _condition_holds(condition, arguments) -> bool:
    tokens, pattern, negate = condition
    return any(bool(pattern.search(_as_text(value))) != negate for value in resolve_path(arguments, tokens))


def resolve_path(document, tokens: tuple) -> list:
    """Every value `tokens` (from `parse_path`) reaches in `document`; [] when the path is missing."""
    values = [document]
    for token in tokens:
        reached = []
        for value in values:
            if token is WILDCARD:
                if isinstance(value, list):
                    reached.extend(value)
                elif isinstance(value, dict):
                    reached.extend(value.values())
            elif isinstance(value, dict) and isinstance(token, str):
                if token in value:
                    reached.append(value[token])
            elif isinstance(value, list):
                index = token if isinstance(token, int) else (int(token) if token.isdigit() else None)
                if index is not None and index < len(value):
                    reached.append(value[index])
        values = reached
    return values


def _as_text(value) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def can_decide(
    deciders: dict, *, user_id: int | None, session_owner_id: int | None, role: str | None
) -> bool:
    """May this person decide? `role` is their membership role in the approval's tenant; someone
    with no membership (None) never decides, even for a Session they once owned."""
    if user_id is None or not role:
        return False
    try:
        allowed = normalize_deciders(deciders)
    except ValueError:
        allowed = default_deciders()
    if allowed["session_owner"] and session_owner_id is not None and user_id == session_owner_id:
        return True
    if allowed["tenant_admins"] and role in ADMIN_ROLES:
        return True
    return role in allowed["roles"]


def ensure_default_policy(tenant) -> ApprovalPolicy:
    """The tenant's "Default" policy: destructive and external risk need a person's approval.

    Idempotent; an existing "Default" policy is returned untouched (admins may have edited it)."""
    existing = ApprovalPolicy.objects.for_tenant(tenant).filter(name=DEFAULT_POLICY_NAME).first()
    if existing is not None:
        return existing
    try:
        # The product seeds it, whoever's request it happens in: one entry, no actor.
        with transaction.atomic(), audit.as_one_entry():
            policy = ApprovalPolicy.objects.create(
                tenant=tenant,
                name=DEFAULT_POLICY_NAME,
                description="Seeded: destructive and external tool calls wait for a person.",
                priority=1000,
            )
            for position, (risk, reason) in enumerate(DEFAULT_RULES, start=1):
                ApprovalRule.objects.create(
                    tenant=tenant,
                    policy=policy,
                    position=position * 10,
                    risk=risk,
                    action=PolicyAction.REQUIRE_APPROVAL,
                    deciders=default_deciders(),
                    expires_after_hours=DEFAULT_EXPIRY_HOURS,
                    reason=reason,
                )
            audit.record("approvalpolicy.seeded", tenant_id=tenant.pk, obj=policy, by_product=True)
    except IntegrityError:  # a concurrent caller seeded it first
        return ApprovalPolicy.objects.for_tenant(tenant).get(name=DEFAULT_POLICY_NAME)
    return policy
