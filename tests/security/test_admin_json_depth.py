"""A tenant admin's JSON in any admin form (tool set environment, sandbox policy, …) nested past
XAGENT_JSON_MAX_DEPTH is a form error, never a RecursionError (a 500)."""

import pytest

pytestmark = pytest.mark.django_db


def test_deep_json_in_a_tool_sets_environment_is_a_form_error(owner_a_admin, tenant_a):
    response = owner_a_admin.post(
        "/admin/tools_app/toolset/add/",
        {"tenant": tenant_a.pk, "name": "deep", "shell_env": "[" * 5000 + "]" * 5000},
    )

    assert response.status_code == 200
    assert "nested deeper than 32 levels" in str(response.context["adminform"].form.errors["shell_env"])
