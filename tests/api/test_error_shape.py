"""Every API error is `{"error": {"code", "message", "details"}}` (CONTRACT Errors), and the
process endpoints (health, schema, docs) answer without credentials."""

import pytest
from rest_framework.test import APIClient

from tenancy_app.models import ApiKey

from ..factories import UserFactory
from ..tenancy.isolation import assert_error_shape, assert_requires_auth

API_KEYS = "/api/v1/api-keys/"
ME = "/api/v1/me/"


class Test400:
    def test_a_malformed_json_body_is_malformed_body(self, api_owner_a):
        response = api_owner_a.post(API_KEYS, data='{"name": "x",', content_type="application/json")

        error = assert_error_shape(response, 400, "malformed_body")
        assert "JSON" in error["message"]
        assert not ApiKey.objects.filter(name="x").exists()

    def test_a_missing_field_is_a_validation_error_naming_it(self, api_owner_a):
        error = assert_error_shape(api_owner_a.post(API_KEYS, {}, format="json"), 400, "validation_error")

        assert list(error["details"]) == ["name"]
        assert isinstance(error["details"]["name"], list) and error["details"]["name"][0]

    @pytest.mark.parametrize("name", ["", "x" * 101])
    def test_a_bad_field_value_is_a_validation_error(self, api_owner_a, name):
        error = assert_error_shape(
            api_owner_a.post(API_KEYS, {"name": name}, format="json"), 400, "validation_error"
        )

        assert "name" in error["details"]

    def test_a_json_body_that_is_not_an_object_is_a_validation_error(self, api_owner_a):
        response = api_owner_a.post(API_KEYS, data="[1, 2]", content_type="application/json")

        error = assert_error_shape(response, 400, "validation_error")
        assert error["details"]  # says what is wrong, whichever key DRF files it under


class Test401And403:
    def test_anonymous_calls_are_401(self, api_anonymous):
        assert_requires_auth(api_anonymous, ME)
        assert_requires_auth(api_anonymous, API_KEYS, methods=("get", "post"), data={"name": "x"})

    def test_a_bad_key_is_401(self, db):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION="Bearer xak_nope_nope")

        assert_error_shape(client.get(ME), 401, "authentication_failed")

    def test_a_user_without_a_tenant_is_403(self, db):
        client = APIClient()
        client.force_login(UserFactory(username="drifter"))

        assert_error_shape(client.get(ME), 403, "permission_denied")

    def test_a_session_post_without_csrf_is_403(self, owner_a):
        client = APIClient(enforce_csrf_checks=True)
        client.force_login(owner_a)

        error = assert_error_shape(
            client.post(API_KEYS, {"name": "x"}, format="json"), 403, "permission_denied"
        )
        assert "CSRF" in error["message"]


class Test404:
    @pytest.mark.parametrize("path", ["/api/v1/nope/", "/api/v1/nope", "/api/v2/me/", "/api/"])
    def test_an_unknown_api_path_is_json(self, api_owner_a, path):
        error = assert_error_shape(api_owner_a.get(path), 404, "not_found")

        assert path in error["message"]

    def test_an_unknown_api_path_is_json_for_anonymous_callers_too(self, api_anonymous):
        assert_error_shape(api_anonymous.post("/api/v1/nope/", {}, format="json"), 404, "not_found")

    @pytest.mark.parametrize("key_id", ["999999", "not-a-number"])
    def test_an_unknown_object_is_json(self, api_owner_a, key_id):
        for method in ("get", "delete"):
            assert_error_shape(getattr(api_owner_a, method)(f"{API_KEYS}{key_id}/"), 404, "not_found")

    def test_an_unknown_page_outside_the_api_stays_html(self, db):
        response = APIClient().get("/no-such-page/")

        assert response.status_code == 404
        assert not response["Content-Type"].startswith("application/json")


class TestContentNegotiation:
    @pytest.mark.parametrize("accept", ["*/*", "application/json"])
    def test_errors_are_json_for_ordinary_api_clients(self, api_anonymous, accept):
        assert_error_shape(api_anonymous.get(ME, HTTP_ACCEPT=accept), 401, "not_authenticated")


class Test405And415:
    @pytest.mark.parametrize("method", ["put", "patch", "post", "delete"])
    def test_a_method_the_route_lacks_is_405(self, api_owner_a, method):
        error = assert_error_shape(
            getattr(api_owner_a, method)(ME, {}, format="json"), 405, "method_not_allowed"
        )

        assert method.upper() in error["message"]

    def test_an_unsupported_media_type_is_415(self, api_owner_a):
        response = api_owner_a.post(API_KEYS, data="name=x", content_type="text/plain")

        assert_error_shape(response, 415, "unsupported_media_type")


@pytest.mark.urls("tests.api.crash_urls")
class Test500:
    @pytest.fixture
    def client(self, api_owner_a):
        api_owner_a.raise_request_exception = False
        return api_owner_a

    def test_a_crash_in_an_api_view_is_json_without_internals(self, client, caplog):
        response = client.get("/api/v1/crash/drf/")

        error = assert_error_shape(response, 500, "server_error")
        assert "secret internal detail" not in response.content.decode()
        assert error["details"] == {}
        assert any("secret internal detail" in str(r.exc_info[1]) for r in caplog.records if r.exc_info), (
            "the crash must be logged with its traceback"
        )

    def test_a_crash_in_a_plain_view_under_api_is_json(self, client):
        response = client.get("/api/v1/crash/plain/")

        assert_error_shape(response, 500, "server_error")
        assert "secret internal detail" not in response.content.decode()

    def test_a_crash_outside_the_api_stays_html(self, client):
        response = client.get("/crash/page/")

        assert response.status_code == 500
        assert not response["Content-Type"].startswith("application/json")

    def test_the_project_routes_still_answer_under_the_crash_urlconf(self, client):
        # A control: the urlconf override added the crashing views and changed nothing else.
        assert client.get(ME).json()["username"] == "owner_a"


class TestProcessEndpoints:
    @pytest.mark.parametrize("path", ["/healthz", "/api/v1/healthz"])
    def test_healthz_reports_database_and_broker(self, db, path):
        response = APIClient().get(path)

        assert response.status_code == 200, response.content
        assert response.json() == {"status": "ok", "database": "ok", "broker": "ok"}
        assert "no-cache" in response["Cache-Control"] or "max-age=0" in response["Cache-Control"]

    def test_healthz_answers_503_naming_a_failing_broker(self, db, monkeypatch):
        from config import views

        def unreachable():
            raise ConnectionError("broker is down")

        monkeypatch.setattr(views.app, "connection_for_write", unreachable)

        response = APIClient().get("/healthz")

        assert response.status_code == 503
        body = response.json()
        assert (body["status"], body["database"]) == ("error", "ok")
        assert body["broker"].startswith("error:") and "broker is down" in body["broker"]

    def test_the_openapi_schema_is_public(self, db):
        response = APIClient().get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")

        assert response.status_code == 200
        schema = response.json()
        assert schema["openapi"].startswith("3.")
        assert "/api/v1/api-keys/" in schema["paths"]
        assert "/api/v1/me/" in schema["paths"]

    def test_the_api_docs_render_anonymously(self, db):
        response = APIClient().get("/api/docs/")

        assert response.status_code == 200
        assert b"swagger" in response.content.lower()
        assert b"/api/v1/schema/" in response.content
