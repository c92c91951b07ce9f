"""A model configuration's "Test connection" (admin; issue #27): the endpoint's model list or
its error, asked with the saved key over the route a Session's calls take — through the outbound
guard when a tenant admin set the URL — and only for configurations the admin may change."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from sessions_app.models import ModelConfig
from tenancy_app.crypto import encrypt

pytestmark = pytest.mark.django_db


def _config(tenant, base_url, *, by_operator=True, key="sk-test-connection", model="scripted-model"):
    return ModelConfig.objects.create(
        tenant=tenant,
        name="checked",
        base_url=base_url,
        api_key_encrypted=encrypt(key),
        model=model,
        context_window=32000,
        max_output_tokens=1024,
        configured_by_operator=by_operator,
    )


def _test_url(config):
    return reverse("admin:sessions_app_modelconfig_test_connection", args=[config.pk])


def test_the_change_form_offers_the_test(owner_a_admin, tenant_a, model_server):
    config = _config(tenant_a, model_server.base_url)

    page = owner_a_admin.get(reverse("admin:sessions_app_modelconfig_change", args=[config.pk]))

    assert _test_url(config) in page.content.decode()


def test_opening_the_page_sends_nothing(owner_a_admin, tenant_a, model_server):
    config = _config(tenant_a, model_server.base_url)

    page = owner_a_admin.get(_test_url(config))

    assert page.status_code == 200 and 'id="connection-result"' not in page.content.decode()
    assert model_server.all_requests == []


def test_a_reachable_endpoint_shows_its_models_asked_with_the_saved_key(
    owner_a_admin, tenant_a, model_server
):
    config = _config(tenant_a, model_server.base_url)

    page = owner_a_admin.post(_test_url(config)).content.decode()

    assert 'data-ok="true">Connected: 1 model(s)' in page
    assert "<code>scripted-model</code>\nis among them" in page
    (request,) = model_server.all_requests
    assert (request.method, request.path) == ("GET", "/v1/models")
    assert request.headers.get("authorization") == "Bearer sk-test-connection"


def test_a_model_name_the_endpoint_does_not_offer_is_pointed_out(owner_a_admin, tenant_a, model_server):
    config = _config(tenant_a, model_server.base_url, model="gpt-typo")

    page = owner_a_admin.post(_test_url(config)).content.decode()

    assert "is <strong>not</strong>\namong them" in page and "<code>scripted-model</code>" in page


def test_a_wrong_base_url_says_where_the_api_should_start(owner_a_admin, tenant_a, model_server):
    config = _config(tenant_a, model_server.base_url.removesuffix("/v1") + "/api")

    page = owner_a_admin.post(_test_url(config)).content.decode()

    assert 'data-ok="false">Not connected' in page and "no model list here (HTTP 404)" in page


def test_a_closed_port_is_a_connection_error(owner_a_admin, tenant_a):
    from tests.integration.processes import free_port

    config = _config(tenant_a, f"http://127.0.0.1:{free_port()}/v1")

    page = owner_a_admin.post(_test_url(config)).content.decode()

    assert "could not connect" in page


def test_a_tenant_admins_url_goes_through_the_outbound_guard(owner_a_admin, tenant_a, model_server):
    config = _config(tenant_a, model_server.base_url, by_operator=False)

    page = owner_a_admin.post(_test_url(config)).content.decode()

    assert "refused by the outbound guard" in page and "loopback" in page
    assert model_server.all_requests == []


def test_another_tenants_configuration_is_404(tenant_a, outsider_b, model_server):
    config = _config(tenant_a, model_server.base_url)
    outsider = Client()
    outsider.force_login(outsider_b)

    assert outsider.get(_test_url(config)).status_code == 404
    assert outsider.post(_test_url(config)).status_code == 404
    assert model_server.all_requests == []


def test_the_list_action_tests_each_selected_configuration(owner_a_admin, tenant_a, model_server):
    config = _config(tenant_a, model_server.base_url)

    response = owner_a_admin.post(
        reverse("admin:sessions_app_modelconfig_changelist"),
        {"action": "test_connections", "_selected_action": [config.pk]},
        follow=True,
    )

    page = response.content.decode()
    assert f"Checked: {model_server.base_url} answered with 1 model(s)" in page
