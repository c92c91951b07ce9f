"""A 404 outside the API is the product's page in every mode (make run runs with DEBUG on, where
Django would show its technical page); API paths keep the CONTRACT's JSON error shape."""

import pytest
from django.test import Client

from sessions_app.runtime import engine
from tests.tenancy.isolation import assert_error_shape


@pytest.fixture(autouse=True)
def _isolated(settings, tmp_path):
    settings.XAGENT_WORKSPACES_DIR = tmp_path / "workspaces"


@pytest.mark.parametrize("debug", [True, False])
def test_an_unknown_workspace_address_gets_the_product_page(owner_a, settings, debug):
    settings.DEBUG = debug
    client = Client()
    client.force_login(owner_a)

    response = client.get("/no-such-page/here")

    assert response.status_code == 404
    html = response.content.decode()
    assert 'data-testid="not-found"' in html and "Back to your Sessions" in html
    assert "URLconf" not in html and "Using the URLconf" not in html  # not Django's technical page
    assert "/no-such-page/here" in html


@pytest.mark.parametrize("debug", [True, False])
def test_another_tenants_session_page_is_the_same_product_404(owner_a, outsider_b, tenant_b, settings, debug):
    settings.DEBUG = debug
    theirs = engine.create_session(tenant=tenant_b, owner=outsider_b, title="Bravo secret plans")
    client = Client()
    client.force_login(owner_a)

    response = client.get(f"/sessions/{theirs.pk}/")

    assert response.status_code == 404
    html = response.content.decode()
    assert 'data-testid="not-found"' in html and "Bravo secret plans" not in html


@pytest.mark.parametrize("debug", [True, False])
def test_an_unknown_api_path_keeps_the_json_error_shape(api_owner_a, settings, debug):
    settings.DEBUG = debug
    assert_error_shape(api_owner_a.get("/api/v1/no-such-route/"), 404, "not_found")


def test_a_missing_trailing_slash_still_redirects(owner_a, settings):
    from django.urls import reverse

    settings.DEBUG = True
    client = Client()
    client.force_login(owner_a)
    memories = reverse("workspace:memories")

    response = client.get(memories.rstrip("/"))

    assert response.status_code == 301 and response["Location"] == memories
