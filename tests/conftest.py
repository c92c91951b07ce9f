"""Shared fixtures. Personas follow STYLE §9: owner_a and member_a belong to tenant A,
outsider_b owns tenant B and must never reach anything of A."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from tenancy_app.choices import Role

from .factories import TenantFactory, issue_key, make_member

SERVICES_MODE = bool(os.environ.get("REDIS_URL"))


def pytest_collection_modifyitems(config, items):
    if SERVICES_MODE:
        return
    skip = pytest.mark.skip(
        reason="needs real PostgreSQL/Redis: set DATABASE_URL and REDIS_URL (see .ci/run)"
    )
    for item in items:
        if "services" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def plain_static_storage(settings):
    """Production mode serves collectstatic's manifest; a test run need not have built one."""
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """Personas are created per test; the production hasher would cost ~0.25 s each."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def no_presence_thread(settings):
    """Slices driven inside the test process must not start the presence thread: it would write
    rows outside each test's transaction. Tests of presence write the rows themselves
    (`presence.beat()`); real worker processes keep the default."""
    settings.XAGENT_PRESENCE_BEAT_SECONDS = 0


@pytest.fixture(scope="session")
def searchable_mcp_servers_root():
    path = Path(tempfile.mkdtemp(prefix="xagent-mcp-servers-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def mcp_servers_dir(settings, searchable_mcp_servers_root) -> Path:
    """stdio MCP servers' own directories, fresh per test (ids repeat across rolled-back tests),
    under a root the sandbox uid can search (pytest's tmp_path lies under a root-only directory)."""
    path = Path(tempfile.mkdtemp(dir=searchable_mcp_servers_root))
    path.chmod(0o711)
    settings.XAGENT_MCP_SERVERS_DIR = path
    return path


@pytest.fixture(autouse=True)
def fresh_shared_configuration():
    """Tenants' shared runtime configuration is keyed by (tenant id, configuration version),
    which repeat across rolled-back tests: start each test with none."""
    from sessions_app.runtime import slice_context

    with slice_context._shared_lock:
        slice_context._shared.clear()


@pytest.fixture(autouse=True)
def fresh_rate_limits():
    """Rate-limit counters are keyed by row ids, which repeat across rolled-back tests: start
    each test with none (process-local cache only; Redis-mode ids do not repeat)."""
    from django.core.cache import cache
    from django.core.cache.backends.locmem import LocMemCache

    if isinstance(cache, LocMemCache):
        cache.clear()


@pytest.fixture
def tenant_a(db):
    return TenantFactory(slug="acme", name="Acme")


@pytest.fixture
def tenant_b(db):
    return TenantFactory(slug="bravo", name="Bravo")


@pytest.fixture
def owner_a(tenant_a):
    return make_member(tenant_a, "owner_a", Role.OWNER)


@pytest.fixture
def member_a(tenant_a):
    return make_member(tenant_a, "member_a", Role.MEMBER)


@pytest.fixture
def outsider_b(tenant_b):
    return make_member(tenant_b, "outsider_b", Role.OWNER)


def _client_with_key(user, tenant):
    _, plaintext = issue_key(tenant, user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    client.api_key = plaintext
    return client


@pytest.fixture
def api_owner_a(owner_a, tenant_a):
    return _client_with_key(owner_a, tenant_a)


@pytest.fixture
def api_member_a(member_a, tenant_a):
    return _client_with_key(member_a, tenant_a)


@pytest.fixture
def api_outsider_b(outsider_b, tenant_b):
    return _client_with_key(outsider_b, tenant_b)


@pytest.fixture
def api_anonymous():
    return APIClient()


@pytest.fixture
def model_server():
    """The scripted OpenAI-compatible server on loopback (the only stand-in: the LLM)."""
    from .support.model_server import ScriptedModelServer

    with ScriptedModelServer() as server:
        yield server


def _scripted_model_config(tenant, model_server):
    from sessions_app.models import ModelConfig

    return ModelConfig.objects.create(
        tenant=tenant,
        name="scripted",
        base_url=model_server.base_url,
        model="scripted-model",
        context_window=32000,
        max_output_tokens=1024,
        is_default=True,
        configured_by_operator=True,  # set up by the test operator: loopback is fine
    )


@pytest.fixture
def model_config_a(tenant_a, model_server):
    """Tenant A's default model: the scripted server, through the real openai client."""
    return _scripted_model_config(tenant_a, model_server)


@pytest.fixture
def model_config_b(tenant_b, model_server):
    """Tenant B's default model: the same scripted server."""
    return _scripted_model_config(tenant_b, model_server)


@pytest.fixture(autouse=True)
def no_pooled_mcp_sessions_left():
    """Pooled MCP sessions outlive a call by design; a test must not inherit another test's
    (nor leave its stdio server processes running)."""
    yield
    from tools_app.mcp.pool import close_pool

    close_pool()


# --- the test database on PostgreSQL --------------------------------------------------------
# Hundreds of tests run with transaction=True (real workers and servers must see their rows);
# after each, Django empties every table. Two costs of that are PostgreSQL's, not the product's:
# TRUNCATE of ~50 tables makes ~50 new relation files (about half a second; DELETE of the few
# rows a test leaves takes milliseconds), and each commit of the post-flush signal handlers
# waits for a WAL flush. Neither is what a test checks, and the database is thrown away.


def _delete_instead_of_truncate():
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade or not tables:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        # Django's foreign keys on PostgreSQL are DEFERRABLE INITIALLY DEFERRED and the statements
        # run in one transaction (execute_sql_flush), so the order of the tables does not matter.
        return [f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(t))};" for t in tables]

    DatabaseOperations.sql_flush = sql_flush


_delete_instead_of_truncate()


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """The test database (one per parallel runner) commits without waiting for the WAL flush,
    for this process and for every worker and web process a test starts on it."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            name = connection.settings_dict["NAME"]
            cursor.execute(f"ALTER DATABASE {connection.ops.quote_name(name)} SET synchronous_commit = off")
            cursor.execute("SET synchronous_commit = off")
    yield
