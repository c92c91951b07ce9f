"""The two databases every scenario runs on, and the environment a child process gets for each.

* sqlite: embedded mode (REDIS_URL empty): a SQLite file in WAL mode, the in-memory channel
  layer, the in-process worker when a scenario starts the stack.
* postgresql: production mode: PostgreSQL at 127.0.0.1:5432 (trust auth, user postgres) and
  Redis at 127.0.0.1:6379 (a database no one else is using), with production's required settings.

Migrations run once per backend into a template (a file, or a template database); each child
starts from a fresh copy, so scenarios never see each other's rows.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = "postgres://postgres@127.0.0.1:5432/postgres"
PG_DATABASE = "xagent_bench"
PG_TEMPLATE = "xagent_bench_template"
REDIS_SERVER = "redis://127.0.0.1:6379"

# The runtime settings every child shares: the zero-latency model for Sessions without a
# ModelConfig, and turn limits far above the longest scripted turn, so only the script ends it.
COMMON_ENV = {
    "DJANGO_SETTINGS_MODULE": "config.settings",
    "XAGENT_MODEL_PROVIDER": "bench.models.Zero",  # ZeroLatencyModel, see bench/models.py
    "XAGENT_MAX_STEPS_PER_TURN": "100000",
    "XAGENT_LOOP_GUARD_REPEATS": "100000",
    "XAGENT_LOOP_GUARD_IDLE_ROUNDS": "100000",
    # DEBUG would keep every SQL statement in memory; neither mode runs with it in production.
    "DEBUG": "false",
    "LOG_LEVEL": "WARNING",
    "PYTHONUNBUFFERED": "1",
}
# Variables of the caller's shell that would change which mode a child runs in.
MODE_VARIABLES = (
    "DATABASE_URL",
    "REDIS_URL",
    "SECRET_KEY",
    "ALLOWED_HOSTS",
    "XAGENT_HTTPS",
    "XAGENT_SECRETS_KEY",
)


def manage(env: dict, *args: str) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stderr[-3000:]}")


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Backend(ABC):
    name: str
    label: str
    root: Path
    prepared: bool = field(default=False, init=False)
    _children: int = field(default=0, init=False)

    def base_env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in MODE_VARIABLES}
        return {**env, **COMMON_ENV, "PYTHONPATH": str(PROJECT_ROOT)}

    def child_env(self) -> dict:
        """A fresh copy of the migrated database and an empty workspace root, for one child."""
        self._children += 1
        workspaces, logs = self.root / f"workspaces-{self._children}", self.root / f"logs-{self._children}"
        workspaces.mkdir(parents=True)
        logs.mkdir()
        return {
            **self.mode_env(self.fresh_database()),
            "XAGENT_WORKSPACES_DIR": str(workspaces),
            "BENCH_LOG_DIR": str(logs),  # the stack's process logs (bench.stack)
        }

    @abstractmethod
    def unavailable(self) -> str:
        """Why this backend cannot run here ("" when it can)."""

    @abstractmethod
    def prepare(self) -> None:
        """Migrate the template every child's database is copied from."""

    @abstractmethod
    def mode_env(self, database_url: str) -> dict: ...

    @abstractmethod
    def fresh_database(self) -> str:
        """A new copy of the template; returns its DATABASE_URL."""

    @abstractmethod
    def cleanup(self) -> None: ...


class SQLiteBackend(Backend):
    def unavailable(self) -> str:
        return ""

    def mode_env(self, database_url: str) -> dict:
        # Empty, not absent: a .env file must not switch the child to production mode.
        return {**self.base_env(), "DATABASE_URL": database_url, "REDIS_URL": ""}

    @property
    def template(self) -> Path:
        return self.root / "template.sqlite3"

    def prepare(self) -> None:
        manage(self.mode_env(f"sqlite:///{self.template}"), "migrate", "--noinput", "-v0")

    def fresh_database(self) -> str:
        path = self.root / f"db-{self._children}.sqlite3"
        shutil.copyfile(self.template, path)
        return f"sqlite:///{path}"

    def cleanup(self) -> None:
        pass  # the files live under the run's temporary directory


class PostgresBackend(Backend):
    def unavailable(self) -> str:
        if not port_open(5432):
            return "PostgreSQL unreachable (127.0.0.1:5432)"
        if not port_open(6379):
            return "Redis unreachable (127.0.0.1:6379)"
        try:
            self._admin("SELECT 1")
        except Exception as exc:  # a server that refuses us is as good as down, and says why
            return f"PostgreSQL unreachable ({exc.__class__.__name__}: {exc})".strip()
        if self.redis_database is None:
            return "Redis has no free database (every one holds keys or has clients)"
        return ""

    @cached_property
    def redis_database(self) -> int | None:
        """The highest-numbered Redis database with no keys and no client connected to it.

        Other checkouts' test runs and stacks share this Redis: a Celery worker of theirs on our
        database would take our tasks (and run them against their own database), so a fixed
        number is not safe. Chosen once per run; emptied before every child and at the end.
        """
        import redis

        server = redis.Redis.from_url(REDIS_SERVER)
        count = int(server.config_get("databases").get("databases", 16))
        busy = {int(client["db"]) for client in server.client_list()} | {
            int(name[2:]) for name in server.info("keyspace")
        }
        return next((db for db in range(count - 1, 0, -1) if db not in busy), None)

    @property
    def redis_url(self) -> str:
        return f"{REDIS_SERVER}/{self.redis_database}"

    @cached_property
    def secrets_key(self) -> str:
        from cryptography.fernet import Fernet

        return Fernet.generate_key().decode()

    def mode_env(self, database_url: str) -> dict:
        return {
            **self.base_env(),
            "DATABASE_URL": database_url,
            "REDIS_URL": self.redis_url,
            "SECRET_KEY": "bench-only-" + "k" * 40,
            "XAGENT_SECRETS_KEY": self.secrets_key,
            "ALLOWED_HOSTS": "127.0.0.1,localhost",
            "XAGENT_HTTPS": "false",
        }

    def prepare(self) -> None:
        self._recreate(PG_TEMPLATE)
        manage(self.mode_env(_database_url(PG_TEMPLATE)), "migrate", "--noinput", "-v0")

    def fresh_database(self) -> str:
        self._recreate(PG_DATABASE, template=PG_TEMPLATE)
        self.flush_redis()
        return _database_url(PG_DATABASE)

    def cleanup(self) -> None:
        for name in (PG_DATABASE, PG_TEMPLATE):
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.flush_redis()

    def flush_redis(self) -> None:
        """Tasks, channel messages and cache keys of the previous child must not reach the next."""
        import redis

        redis.Redis.from_url(self.redis_url).flushdb()

    def _recreate(self, name: str, template: str = "") -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._admin(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))

    @staticmethod
    def _admin(sql: str) -> None:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3) as connection:
            connection.execute(sql)


def _database_url(name: str) -> str:
    return f"postgres://postgres@127.0.0.1:5432/{name}"


def backends(root: Path) -> list[Backend]:
    return [
        SQLiteBackend("sqlite", "SQLite", root / "sqlite"),
        PostgresBackend("postgresql", "PostgreSQL + Redis", root / "postgresql"),
    ]
