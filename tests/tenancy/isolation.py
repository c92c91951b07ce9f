"""Cross-tenant and error-shape assertions shared by every API route test (STYLE §9).

CONTRACT: every API error is `{"error": {"code", "message", "details"}}`, and another
tenant's object is a 404 — never a 403 or a success that would confirm it exists.

Use the functions directly, or subclass `TenantIsolationContract` in a test class for a
tenant-owned resource to get its anonymous and cross-tenant tests for free.
"""

from __future__ import annotations

import re

import pytest

DETAIL_METHODS = ("get", "patch", "put", "delete")
_BODY_METHODS = {"post", "put", "patch"}
_SNAKE_CASE = re.compile(r"^[a-z][a-z0-9_]*$")


def assert_error_shape(response, status: int, code: str | None = None) -> dict:
    """The response is a CONTRACT error with `status` (and `code`); returns the `error` object."""
    content = response.content[:500]
    assert response.status_code == status, f"expected {status}, got {response.status_code}: {content!r}"
    assert response["Content-Type"].startswith("application/json"), f"not JSON: {response['Content-Type']}"
    body = response.json()
    assert set(body) == {"error"}, f"error body must hold only 'error': {body}"
    error = body["error"]
    assert set(error) == {"code", "message", "details"}, f"bad error object: {error}"
    assert isinstance(error["code"], str) and _SNAKE_CASE.match(error["code"]), (
        f"code not snake_case: {error}"
    )
    assert isinstance(error["message"], str) and error["message"].strip(), f"empty message: {error}"
    assert isinstance(error["details"], dict), f"details must be an object: {error}"
    if code is not None:
        assert error["code"] == code, f"expected code {code!r}: {error}"
    return error


def _call(client, method: str, url: str, data: dict | None = None):
    if method in _BODY_METHODS:
        return getattr(client, method)(url, data or {}, format="json")
    return getattr(client, method)(url)


def assert_cross_tenant_404(outsider_client, detail_url: str, methods=DETAIL_METHODS, data=None, hidden=()):
    """Every method on another tenant's object answers the CONTRACT 404 and leaks nothing.

    `data` is the body sent with PUT/PATCH/POST (a valid one, so a 404 cannot be a side
    effect of validation); `hidden` lists strings of the object that must not appear.
    """
    for method in methods:
        response = _call(outsider_client, method, detail_url, data)
        assert_error_shape(response, 404, "not_found")
        for text in hidden:
            assert str(text) not in response.content.decode(), f"{method.upper()} leaked {text!r}"


def result_ids(client, list_url: str, max_pages: int = 20) -> list:
    """The `id`s of every row a list endpoint answers, following cursor `next` links."""
    ids, url = [], list_url
    for _ in range(max_pages):
        response = client.get(url)
        assert response.status_code == 200, (
            f"list {url} answered {response.status_code}: {response.content[:300]!r}"
        )
        body = response.json()
        rows = body["results"] if isinstance(body, dict) else body
        ids.extend(row["id"] for row in rows)
        url = body.get("next") if isinstance(body, dict) else None
        if not url:
            return ids
    raise AssertionError(f"{list_url} did not finish within {max_pages} pages")


def assert_list_excludes(outsider_client, list_url: str, obj_id) -> list:
    """Another tenant's row is not in the list; returns the ids that were listed."""
    ids = result_ids(outsider_client, list_url)
    assert obj_id not in ids, f"{list_url} listed another tenant's row {obj_id}"
    return ids


def assert_requires_auth(anonymous_client, url: str, methods=("get",), data=None):
    """Without credentials every method answers the CONTRACT 401 and a Bearer challenge."""
    for method in methods:
        response = _call(anonymous_client, method, url, data)
        assert_error_shape(response, 401, "not_authenticated")
        assert response["WWW-Authenticate"].startswith("Bearer"), response.get("WWW-Authenticate")


class TenantIsolationContract:
    """Mixin for a test class about one tenant-owned API resource.

    Subclasses set `list_url`, optionally `detail_methods` / `update_data`, and provide a
    fixture `tenant_a_object` (a row of tenant A, created by `owner_a`'s side); `detail_url`
    builds the object's URL (override it when the route is not `<list_url><id>/`). The
    personas come from tests/conftest.py: `api_outsider_b` is tenant B's owner.
    """

    list_url: str = ""
    detail_methods = DETAIL_METHODS
    update_data: dict | None = None

    def detail_url(self, obj) -> str:
        return f"{self.list_url}{obj.pk}/"

    @pytest.fixture
    def tenant_a_object(self):  # pragma: no cover - subclasses provide it
        raise NotImplementedError("define a `tenant_a_object` fixture returning a row of tenant A")

    def test_it_serves_the_object_to_its_own_tenant(self, api_owner_a, tenant_a_object):
        # The control for the 404s below: the URL is right, only the tenant differs.
        response = api_owner_a.get(self.detail_url(tenant_a_object))
        assert response.status_code == 200, response.content[:300]
        assert response.json()["id"] == tenant_a_object.pk

    def test_it_requires_auth_for_the_list(self, api_anonymous):
        assert_requires_auth(api_anonymous, self.list_url)

    def test_it_requires_auth_for_an_object(self, api_anonymous, tenant_a_object):
        assert_requires_auth(
            api_anonymous,
            self.detail_url(tenant_a_object),
            methods=self.detail_methods,
            data=self.update_data,
        )

    def test_it_answers_404_for_another_tenants_object(self, api_outsider_b, tenant_a_object):
        assert_cross_tenant_404(
            api_outsider_b,
            self.detail_url(tenant_a_object),
            methods=self.detail_methods,
            data=self.update_data,
        )

    def test_it_leaves_another_tenants_object_out_of_the_list(self, api_outsider_b, tenant_a_object):
        assert_list_excludes(api_outsider_b, self.list_url, tenant_a_object.pk)
