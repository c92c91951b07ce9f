"""Approval policies: which tool calls a person must approve (or may never run), and who decides.

Owned facts: `ApprovalPolicy` (a named, ordered group of rules of one tenant, managed in Django
admin) and `ApprovalRule` (one match -> action line). Matching lives in `approvals_app.policy`;
this module only stores and validates the rules, so an admin gets a form error for a rule the
matcher could not use.

Argument-condition regexes are written by tenant admins, who are not trusted with the host
(ARCHITECTURE §7), so they are compiled by RE2 (`google-re2`), whose matching time is linear in
the input: `(a+)+$` cannot stall a worker or the "Test a call" view. RE2 refuses what it cannot
run in linear time (backreferences, lookaround); such a pattern is a validation error on save.
"""

from __future__ import annotations

import re

import re2
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from tenancy_app.choices import Role
from tenancy_app.models import TenantOwnedModel

from .choices import PolicyAction, Risk, ToolSource

MAX_REGEX_LENGTH = 500
MAX_CONDITIONS = 50  # of one rule
# Memory budget of one compiled pattern; RE2 refuses (a validation error) a pattern that needs more.
MAX_REGEX_MEMORY = 1 << 20
CONDITION_KEYS = frozenset({"path", "regex", "negate"})
DECIDER_KEYS = frozenset({"session_owner", "tenant_admins", "roles"})


def default_deciders() -> dict:
    return {"session_owner": True, "tenant_admins": True, "roles": []}


# --- JSON path syntax of argument conditions ------------------------------------------------
#
#   [$[.]]segment(.segment | [N] | [*])*
#
# A dotted segment is a key of an object, or an index when the value is a list (`paths.0`);
# `*` (`.*` or `[*]`) fans out over every element of a list / value of an object; `[N]` is a
# list index. `$` / `$.` in front is optional: `$.paths[*]`, `paths[*]`, `paths.*` are the same.
# Keys cannot contain `.`, `[` or `]`.

WILDCARD = None  # token for `*`
_TOKEN = re.compile(r"\.?([^.\[\]]+)|\[(\*|\d+)\]")


def parse_path(path: str) -> tuple:
    """Tokens of a condition path: str (key, or list index if digits), int (list index), None (`*`).

    Raises ValueError for anything outside the syntax above."""
    if not isinstance(path, str):
        raise ValueError("path must be a string")
    text = path.strip()
    if text.startswith("$"):
        text = text[1:]
    if not text or text == ".":
        raise ValueError("path is empty")
    tokens: list = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or (pos > 0 and match.group(1) is not None and text[pos] != "."):
            raise ValueError(f"cannot read path {path!r} at character {pos + 1}")
        key, bracket = match.group(1), match.group(2)
        if key is not None:
            tokens.append(WILDCARD if key == "*" else key)
        else:
            tokens.append(WILDCARD if bracket == "*" else int(bracket))
        pos = match.end()
    return tuple(tokens)


def _re2_options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is reported to the admin, not to stderr
    options.max_mem = MAX_REGEX_MEMORY
    return options


def compile_regex(regex: str):
    """An RE2 pattern (linear-time `search`); ValueError with RE2's reason if it cannot compile."""
    try:
        return re2.compile(regex, options=_re2_options())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "unsupported"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(f"{reason} (RE2 syntax: no backreferences or lookaround)") from None


def compile_conditions(raw) -> list[tuple[tuple, object, bool]]:
    """The argument conditions as (path tokens, compiled regex, negate); ValueError if unusable."""
    if raw in (None, ""):
        return []
    if not isinstance(raw, list):
        raise ValueError("argument conditions must be a JSON list")
    if len(raw) > MAX_CONDITIONS:
        raise ValueError(f"at most {MAX_CONDITIONS} argument conditions per rule (split the rule)")
    compiled = []
    for number, condition in enumerate(raw, start=1):
        if not isinstance(condition, dict):
            raise ValueError(f"condition {number} must be an object with 'path' and 'regex'")
        unknown = set(condition) - CONDITION_KEYS
        if unknown:
            raise ValueError(f"condition {number} has unknown keys: {', '.join(sorted(unknown))}")
        try:
            tokens = parse_path(condition.get("path"))
        except ValueError as exc:
            raise ValueError(f"condition {number}: {exc}") from None
        regex = condition.get("regex")
        if not isinstance(regex, str) or not regex:
            raise ValueError(f"condition {number} needs a non-empty 'regex'")
        if len(regex) > MAX_REGEX_LENGTH:
            raise ValueError(f"condition {number}: regex longer than {MAX_REGEX_LENGTH} characters")
        try:
            pattern = compile_regex(regex)
        except ValueError as exc:
            raise ValueError(f"condition {number}: invalid regex {regex!r}: {exc}") from None
        negate = condition.get("negate", False)
        if not isinstance(negate, bool):
            raise ValueError(f"condition {number}: 'negate' must be true or false")
        compiled.append((tokens, pattern, negate))
    return compiled


def normalize_deciders(raw) -> dict:
    """`{"session_owner", "tenant_admins", "roles"}` with missing keys off; empty -> the default."""
    if not raw:
        return default_deciders()
    if not isinstance(raw, dict):
        raise ValueError("deciders must be a JSON object")
    unknown = set(raw) - DECIDER_KEYS
    if unknown:
        raise ValueError(f"deciders has unknown keys: {', '.join(sorted(unknown))}")
    session_owner, tenant_admins = raw.get("session_owner", False), raw.get("tenant_admins", False)
    roles = raw.get("roles", [])
    if not isinstance(session_owner, bool) or not isinstance(tenant_admins, bool):
        raise ValueError("'session_owner' and 'tenant_admins' must be true or false")
    if not isinstance(roles, list) or any(role not in Role.values for role in roles):
        raise ValueError(f"'roles' must be a list of: {', '.join(Role.values)}")
    return {"session_owner": session_owner, "tenant_admins": tenant_admins, "roles": sorted(set(roles))}


class ApprovalPolicy(TenantOwnedModel):
    name = models.CharField(max_length=100)
    description = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    priority = models.PositiveIntegerField(
        default=100, help_text="lower first; decides only between matches of the same action"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "approvals_app"
        ordering = ["priority", "id"]
        verbose_name_plural = "approval policies"
        constraints = [models.UniqueConstraint(fields=["tenant", "name"], name="unique_approval_policy_name")]

    def __str__(self) -> str:
        return self.name


class ApprovalRule(TenantOwnedModel):
    """Blank match fields match anything; every filled one must hold (deny wins across rules)."""

    policy = models.ForeignKey(ApprovalPolicy, on_delete=models.CASCADE, related_name="rules")
    position = models.PositiveIntegerField(default=0, help_text="order within the policy, lower first")
    tool_glob = models.CharField(
        max_length=200,
        blank=True,
        help_text="fnmatch glob on the tool name (fs_*, *__add) or mcp:<server>:<tool>; blank = any",
    )
    toolset = models.CharField(max_length=100, blank=True, help_text="tool set name; blank = any")
    risk = models.CharField(max_length=12, choices=Risk.choices, blank=True, help_text="blank = any")
    source = models.CharField(max_length=10, choices=ToolSource.choices, blank=True, help_text="blank = any")
    argument_conditions = models.JSONField(
        default=list,
        blank=True,
        help_text='all must hold: [{"path": "paths[*]", "regex": "^drafts/", "negate": true}]; '
        "with [*] a condition holds if any element matches; a missing path never holds; "
        "regexes use RE2 syntax (no backreferences or lookaround)",
    )
    action = models.CharField(
        max_length=20, choices=PolicyAction.choices, default=PolicyAction.REQUIRE_APPROVAL
    )
    deciders = models.JSONField(
        default=default_deciders,
        blank=True,
        help_text='{"session_owner": true, "tenant_admins": true, "roles": ["member"]}',
    )
    expires_after_hours = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="undecided -> expired (a rejection)",
    )
    reason = models.CharField(
        max_length=500,
        blank=True,
        help_text="why: shown to the person deciding and, for deny, to the model and on the tool card",
    )
    enabled = models.BooleanField(default=True)

    class Meta:
        app_label = "approvals_app"
        ordering = ["position", "id"]

    def __str__(self) -> str:
        return self.label

    @property
    def label(self) -> str:
        parts = [
            f"tool {self.tool_glob}" if self.tool_glob else "",
            f"toolset {self.toolset}" if self.toolset else "",
            f"risk {self.risk}" if self.risk else "",
            f"source {self.source}" if self.source else "",
            f"{len(self.argument_conditions)} argument condition(s)"
            if isinstance(self.argument_conditions, list) and self.argument_conditions
            else "",
        ]
        return f"{' · '.join(p for p in parts if p) or 'any call'} → {self.action}"

    def clean(self):
        super().clean()
        errors = {}
        try:
            compile_conditions(self.argument_conditions)
        except ValueError as exc:
            errors["argument_conditions"] = str(exc)
        try:
            deciders = normalize_deciders(self.deciders)
        except ValueError as exc:
            errors["deciders"] = str(exc)
        else:
            if not (deciders["session_owner"] or deciders["tenant_admins"] or deciders["roles"]):
                errors["deciders"] = "At least one kind of person must be able to decide."
        if errors:
            raise ValidationError(errors)

    def save(self, *args, **kwargs):
        # A rule always lives in its policy's tenant (admin inlines never show the tenant field).
        if self.policy_id:
            self.tenant_id = self.policy.tenant_id
        super().save(*args, **kwargs)
