"""Settings parsing (config/settings.py), in fresh interpreters with a controlled environment:
the embedded default, production, and bad values that must stop the process naming the variable."""

import json
import os
import secrets
import string
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

from config import sandbox_reach

PROJECT_ROOT = Path(__file__).resolve().parents[2]

# Everything config/settings.py reads, so the developer's or CI's environment cannot leak in.
_READ_BY_SETTINGS = {
    "DATABASE_URL",
    "REDIS_URL",
    "SECRET_KEY",
    "DEBUG",
    "ALLOWED_HOSTS",
    "CSRF_TRUSTED_ORIGINS",
    "CONN_MAX_AGE",
    "SECURE_HSTS_SECONDS",
    "LOG_LEVEL",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
}

SHOW_SETTINGS = """
import json
import django
django.setup()
from channels.layers import InMemoryChannelLayer
from django.conf import settings as s
from django.utils.module_loading import import_string
db = s.DATABASES["default"]
layer = import_string(s.CHANNEL_LAYERS["default"]["BACKEND"])
print(json.dumps({
    "engine": db["ENGINE"], "name": str(db["NAME"]), "host": db.get("HOST"), "options": db.get("OPTIONS", {}),
    "conn_health_checks": db.get("CONN_HEALTH_CHECKS"),
    "debug": s.DEBUG, "embedded": s.EMBEDDED, "allowed_hosts": s.ALLOWED_HOSTS,
    "broker": s.CELERY_BROKER_URL, "channel_layer": s.CHANNEL_LAYERS["default"]["BACKEND"],
    "in_memory_layer": issubclass(layer, InMemoryChannelLayer),
    "channel_hosts": s.CHANNEL_LAYERS["default"].get("CONFIG", {}).get("hosts"),
    "cache": s.CACHES["default"]["BACKEND"], "ssl_redirect": getattr(s, "SECURE_SSL_REDIRECT", False),
    "session_cookie_secure": s.SESSION_COOKIE_SECURE, "secrets_key": s.XAGENT_SECRETS_KEY,
    "context_window": s.XAGENT_CONTEXT_WINDOW, "max_output_tokens": s.XAGENT_MAX_OUTPUT_TOKENS,
    "workspaces": str(s.XAGENT_WORKSPACES_DIR),
}))
"""


def controlled_env(**values: str) -> dict:
    env = {
        name: value
        for name, value in os.environ.items()
        # The run's sandbox data directory (tests/sandbox_data.py) stays: a root run from a private
        # checkout would otherwise make one in /var/lib/xagent.
        if name not in _READ_BY_SETTINGS
        and (not name.startswith("XAGENT_") or name == "XAGENT_SANDBOX_DATA_DIR")
    }
    env["DJANGO_SETTINGS_MODULE"] = "config.settings"
    env.update(values)
    return env


def default_sandbox_roots_dir() -> Path:
    """`var/` of the checkout, or the sandbox data directory when a root process's sandbox could
    not reach it (config/sandbox_reach.py)."""
    if sandbox_reach.out_of_reach(PROJECT_ROOT / "var" / "workspaces"):
        return Path(os.environ.get("XAGENT_SANDBOX_DATA_DIR") or sandbox_reach.default_data_dir(PROJECT_ROOT))
    return PROJECT_ROOT / "var"


def run_python(*args: str, **values: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=PROJECT_ROOT,
        env=controlled_env(**values),
        capture_output=True,
        text=True,
        timeout=120,
    )


def load_settings(**values: str) -> dict:
    result = run_python("-c", SHOW_SETTINGS, **values)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def startup_error(**values: str) -> str:
    """The ImproperlyConfigured message that stopped a fresh process."""
    result = run_python("-c", SHOW_SETTINGS, **values)
    assert result.returncode != 0, f"started with {values}: {result.stdout[-500:]}"
    marker = "ImproperlyConfigured: "
    assert marker in result.stderr, f"did not stop with ImproperlyConfigured:\n{result.stderr[-1500:]}"
    return result.stderr[result.stderr.rindex(marker) + len(marker) :]


def random_secret_key() -> str:
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(60))


def production_env(**overrides: str) -> dict:
    return {
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "SECRET_KEY": random_secret_key(),
        "ALLOWED_HOSTS": "example.com,api.example.com",
        "XAGENT_SECRETS_KEY": Fernet.generate_key().decode(),
        "DATABASE_URL": "postgres://xagent:pw@db.example.com:5432/xagent",
        **overrides,
    }


needs_no_dotenv = pytest.mark.skipif(
    (PROJECT_ROOT / ".env").is_file(),
    reason="a .env file at the project root would feed the 'unset' variables",
)


@needs_no_dotenv
class TestEmbeddedDefault:
    def test_it_runs_on_sqlite_in_wal_mode_with_in_process_services(self):
        s = load_settings()

        assert s["engine"] == "django.db.backends.sqlite3"
        assert s["name"] == str(PROJECT_ROOT / "var" / "db.sqlite3")
        assert "journal_mode=WAL" in s["options"]["init_command"]
        assert s["options"]["transaction_mode"] == "IMMEDIATE"
        assert (s["debug"], s["embedded"]) == (True, True)
        assert s["broker"].startswith("memory://")
        assert s["in_memory_layer"] is True, s["channel_layer"]
        assert s["cache"].endswith("LocMemCache")
        assert s["ssl_redirect"] is False
        assert (s["context_window"], s["max_output_tokens"]) == (128000, 4096)
        assert s["workspaces"] == str(default_sandbox_roots_dir() / "workspaces")

    def test_it_derives_a_valid_secrets_key_from_the_secret_key(self):
        first = load_settings(SECRET_KEY="a" * 50)["secrets_key"]
        second = load_settings(SECRET_KEY="b" * 50)["secrets_key"]

        Fernet(first.encode())  # raises if it is not a Fernet key
        assert first != second

    def test_it_reads_explicit_values(self):
        s = load_settings(DEBUG="off", XAGENT_CONTEXT_WINDOW="32000", XAGENT_MAX_OUTPUT_TOKENS="1000")

        assert s["debug"] is False
        assert (s["context_window"], s["max_output_tokens"]) == (32000, 1000)

    def test_the_system_check_is_clean(self):
        result = run_python("manage.py", "check", "--fail-level", "WARNING")

        assert result.returncode == 0, result.stderr


class TestProduction:
    def test_pooling_off_keeps_persistent_connections_with_health_checks(self):
        s = load_settings(**production_env(), XAGENT_DB_POOL_SIZE="0", CONN_MAX_AGE="60")

        assert "pool" not in s["options"]
        assert s["conn_health_checks"] is True

    def test_statements_are_prepared_on_postgresql_unless_turned_off(self):
        # A step's dozen statements are planned once per connection, not on every step.
        prepared = load_settings(**production_env())["options"]
        assert (prepared["server_side_binding"], prepared["prepare_threshold"]) == (True, 5)

        pooler = load_settings(**production_env(), XAGENT_DB_PREPARED_STATEMENTS="false")["options"]
        assert "server_side_binding" not in pooler and "prepare_threshold" not in pooler

    def test_persistent_connections_beside_a_pool_are_refused_by_name(self):
        result = run_python("-c", SHOW_SETTINGS, **production_env(), CONN_MAX_AGE="60")

        assert result.returncode != 0
        assert "CONN_MAX_AGE" in result.stderr and "XAGENT_DB_POOL_SIZE=0" in result.stderr

    def test_redis_url_switches_to_production_services(self):
        s = load_settings(**production_env())

        assert (s["debug"], s["embedded"]) == (False, False)
        assert s["engine"] == "django.db.backends.postgresql"
        assert (s["name"], s["host"]) == ("xagent", "db.example.com")
        assert "init_command" not in s["options"]
        # Connections come from a bounded pool per process (psycopg_pool discards broken ones).
        assert s["options"]["pool"] == {"min_size": 1, "max_size": 10, "timeout": 60.0}
        assert s["conn_health_checks"] is False
        assert s["broker"] == "redis://127.0.0.1:6379/0"
        assert s["channel_layer"] == "config.channel_layer.RedisChannelLayer"
        assert s["in_memory_layer"] is False
        # Reads get headroom over channels_redis's 5 s blocking pop (redis-py's default is also 5 s).
        assert s["channel_hosts"] == [{"address": "redis://127.0.0.1:6379/0", "socket_timeout": 15}]
        assert s["cache"] == "django.core.cache.backends.redis.RedisCache"
        assert s["allowed_hosts"] == ["example.com", "api.example.com"]
        assert s["ssl_redirect"] is True and s["session_cookie_secure"] is True

    def test_https_can_be_turned_off_for_plain_http_deployments(self):
        s = load_settings(**production_env(XAGENT_HTTPS="false"))

        assert s["ssl_redirect"] is False and s["session_cookie_secure"] is False

    def test_the_deploy_check_passes_at_warning_level(self, tmp_path):
        env = production_env(DATABASE_URL=f"sqlite:///{tmp_path / 'x.sqlite3'}", ALLOWED_HOSTS="example.com")
        result = run_python("manage.py", "check", "--deploy", "--fail-level", "WARNING", **env)

        assert result.returncode == 0, result.stderr


class TestBadValues:
    @pytest.mark.parametrize(
        "values, variable",
        [
            ({"DEBUG": "maybe"}, "DEBUG"),
            ({"XAGENT_HTTPS": "sometimes"}, "XAGENT_HTTPS"),
            ({"XAGENT_CONTEXT_WINDOW": "abc"}, "XAGENT_CONTEXT_WINDOW"),
            ({"XAGENT_CONTEXT_WINDOW": "0"}, "XAGENT_CONTEXT_WINDOW"),
            ({"XAGENT_CONTEXT_WINDOW": "-5"}, "XAGENT_CONTEXT_WINDOW"),
            ({"XAGENT_MAX_OUTPUT_TOKENS": "200000"}, "XAGENT_MAX_OUTPUT_TOKENS"),
            ({"REDIS_URL": "http://x"}, "REDIS_URL"),
            ({"XAGENT_SECRETS_KEY": "short"}, "XAGENT_SECRETS_KEY"),
            ({"XAGENT_SECRETS_KEY": "c2hvcnQ="}, "XAGENT_SECRETS_KEY"),
        ],
        ids=lambda v: v if isinstance(v, str) else "=".join(next(iter(v.items()))),
    )
    def test_it_stops_naming_the_variable(self, values, variable):
        assert variable in startup_error(**values)

    @pytest.mark.parametrize("missing", ["SECRET_KEY", "ALLOWED_HOSTS", "XAGENT_SECRETS_KEY"])
    def test_production_requires_its_secrets_and_hosts(self, missing):
        env = production_env()
        del env[missing]

        message = startup_error(**env)

        assert missing in message and "REDIS_URL" in message

    def test_redis_url_without_secret_key_stops(self):
        assert "SECRET_KEY" in startup_error(REDIS_URL="redis://127.0.0.1:6379/0")

    def test_an_unknown_database_scheme_names_database_url(self):
        assert "DATABASE_URL" in startup_error(DATABASE_URL="nonsense://x")

    def test_a_database_url_without_a_scheme_names_database_url(self):
        assert "DATABASE_URL" in startup_error(DATABASE_URL="nonsense")


SHOW_SLICE_LIMITS = """
import json
import django
django.setup()
from django.conf import settings
from config.celery import app
import sessions_app.tasks
task = app.tasks["sessions.drive_session"]
print(json.dumps({
    "soft": task.soft_time_limit, "hard": task.time_limit,
    "soft_shutdown": app.conf.worker_soft_shutdown_timeout,
    "poison_attempts": settings.XAGENT_POISON_SLICE_ATTEMPTS,
}))
"""


class TestSliceLimits:
    def _limits(self, **values: str) -> dict:
        result = run_python("-c", SHOW_SLICE_LIMITS, **values)
        assert result.returncode == 0, result.stderr[-2000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    @needs_no_dotenv
    def test_drive_session_gets_limits_well_above_a_slice_and_the_longest_shell_call(self):
        from tools_app.native.shell import MAX_TIMEOUT_SECONDS

        limits = self._limits()

        assert limits["soft"] > 30 + MAX_TIMEOUT_SECONDS and limits["hard"] > limits["soft"]
        assert limits["soft_shutdown"] > 30  # a slice's budget (brain.SLICE_MAX_SECONDS)
        assert limits["poison_attempts"] == 3

    def test_the_limits_come_from_the_environment(self):
        limits = self._limits(
            XAGENT_SLICE_SOFT_TIME_LIMIT="100",
            XAGENT_SLICE_TIME_LIMIT="120",
            XAGENT_WORKER_SOFT_SHUTDOWN_SECONDS="50",
            XAGENT_POISON_SLICE_ATTEMPTS="5",
        )

        assert limits == {"soft": 100, "hard": 120, "soft_shutdown": 50.0, "poison_attempts": 5}

    def test_a_hard_limit_not_above_the_soft_one_stops(self):
        message = startup_error(XAGENT_SLICE_SOFT_TIME_LIMIT="100", XAGENT_SLICE_TIME_LIMIT="100")

        assert "XAGENT_SLICE_TIME_LIMIT" in message

    def test_an_elicitation_wait_the_slice_would_cut_short_stops(self):
        message = startup_error(XAGENT_SLICE_SOFT_TIME_LIMIT="300", XAGENT_ELICITATION_TIMEOUT_SECONDS="300")

        assert "XAGENT_ELICITATION_TIMEOUT_SECONDS" in message

    def test_a_hard_limit_past_the_visibility_timeout_stops(self):
        env = production_env(
            XAGENT_VISIBILITY_TIMEOUT="600", XAGENT_SLICE_SOFT_TIME_LIMIT="300", XAGENT_SLICE_TIME_LIMIT="700"
        )

        assert "XAGENT_VISIBILITY_TIMEOUT" in startup_error(**env)
