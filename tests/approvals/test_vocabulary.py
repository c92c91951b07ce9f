"""One vocabulary: `Risk`, `ToolSource` and `PolicyAction` are defined once (approvals_app.choices,
the lowest app that needs them) and every model field and tool uses that one definition."""

import ast
from pathlib import Path

import pytest

from approvals_app.choices import PolicyAction, Risk, ToolSource
from approvals_app.policy_models import ApprovalRule
from tools_app import base
from tools_app.models import Tool
from tools_app.registry import NATIVE_TOOLS

ROOT = Path(__file__).resolve().parents[2]
APPS = ("approvals_app", "tools_app", "sessions_app", "skills_app", "tenancy_app", "config")


@pytest.mark.parametrize(
    ("model", "field", "vocabulary"),
    [
        (ApprovalRule, "risk", Risk),
        (ApprovalRule, "source", ToolSource),
        (ApprovalRule, "action", PolicyAction),
        (Tool, "risk", Risk),
        (Tool, "source", ToolSource),
    ],
)
def test_model_fields_use_the_one_definition(model, field, vocabulary):
    assert model._meta.get_field(field).choices == vocabulary.choices


def test_tools_declare_their_risk_in_it():
    assert base.Risk is Risk
    assert all(isinstance(tool.risk, Risk) for tool in NATIVE_TOOLS.values())


def test_the_stored_values_never_change():
    # Tool rows, rules and PendingApproval.risk/tool_source store these strings; CONTRACT names them.
    assert Risk.values == ["read", "write", "destructive", "external"]
    assert ToolSource.values == ["native", "mcp"]
    assert PolicyAction.values == ["allow", "require_approval", "deny"]


def product_modules():
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def test_no_second_definition_of_the_values():
    """No enumeration, constant or choices list elsewhere spells these values out again."""
    distinctive = {"require_approval", "destructive"}
    found = []
    for path in product_modules():
        if path == ROOT / "approvals_app/choices.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and node.value in distinctive:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not found, found
