"""Start real processes of the product (runstack, celery worker) for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2 as httpx

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def embedded_env(tmp_path: Path) -> dict[str, str]:
    """Environment of a fresh embedded-mode install rooted in tmp_path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"REDIS_URL", "SECRET_KEY", "ALLOWED_HOSTS", "XAGENT_HTTPS", "XAGENT_SECRETS_KEY"}
    }
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    env["XAGENT_WORKSPACES_DIR"] = str(tmp_path / "workspaces")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def database_env_for_workers() -> dict[str, str]:
    """This process's environment with DATABASE_URL pointing at the test database pytest-django made."""
    from urllib.parse import urlsplit, urlunsplit

    from django.db import connection

    env = dict(os.environ)
    parts = urlsplit(env["DATABASE_URL"])
    env["DATABASE_URL"] = urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    # A failed set-up command shows what it printed: the exception alone says only its exit status.
    assert done.returncode == 0, f"manage.py {args[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}"
    return done


_migrated_template: Path | None = None


def migrate_embedded(env: dict[str, str]) -> None:
    """`manage.py migrate` for the fresh embedded SQLite database `env` names, by copying a
    database this test process migrated once: a migrate costs about ten CPU seconds, and
    the suite makes dozens of fresh installs on two cores. The copy is the same schema and rows
    (migrations and post_migrate depend on no setting these tests vary)."""
    import sqlite3
    import tempfile

    global _migrated_template
    target = Path(env["DATABASE_URL"].removeprefix("sqlite:///"))
    assert env["DATABASE_URL"].startswith("sqlite:///") and not target.exists(), env["DATABASE_URL"]
    if _migrated_template is None:
        root = Path(tempfile.mkdtemp(prefix="xagent-migrated-"))
        manage(embedded_env(root), "migrate", "--noinput", "-v0")
        _migrated_template = root / "db.sqlite3"
    target.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(_migrated_template) as source, sqlite3.connect(target) as copy:
        source.backup(copy)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextmanager
def running(cmd: list[str], env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen]:
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=PROJECT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            _stop(proc)


def wait_for_http(url: str, proc: subprocess.Popen, log_path: Path, deadline_s: float = 60) -> httpx.Response:
    """Poll `url` until it answers 200; fail with the process log if it dies or never answers."""
    deadline = time.monotonic() + deadline_s
    last_error = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"process exited with {proc.returncode}:\n{log_path.read_text(errors='replace')}"
            )
        try:
            response = httpx.get(url, timeout=10)
            if response.status_code == 200:
                return response
            last_error = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as exc:
            last_error = repr(exc)
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered 200 ({last_error}):\n{log_path.read_text(errors='replace')}")


def worker_command(name: str, concurrency: int = 4) -> list[str]:
    """A real `celery -A config worker` (threads pool), uniquely named so tests never share one.
    `concurrency`: Sessions it drives at once (production's default is XAGENT_WORKER_SESSIONS)."""
    import uuid

    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "config",
        "worker",
        "--pool",
        "threads",
        "--concurrency",
        str(concurrency),
        "--loglevel",
        "INFO",
        "--hostname",
        f"{name}-{uuid.uuid4().hex[:8]}@%h",
        "--without-mingle",
        "--without-gossip",
    ]


def wait_for_port(port: int, proc: subprocess.Popen, log_path: Path, deadline_s: float = 30) -> None:
    """Block until something accepts TCP connections on 127.0.0.1:port (fail with the log if it dies)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        if proc.poll() is not None:
            raise AssertionError(
                f"process exited with {proc.returncode}:\n{log_path.read_text(errors='replace')}"
            )
        time.sleep(0.05)
    raise AssertionError(f"nothing accepted on port {port}:\n{log_path.read_text(errors='replace')}")


@contextmanager
def web_and_worker(log_dir: Path, tag: str = "") -> Iterator[str]:
    """daphne (runstack, web only with REDIS_URL) + one Celery worker on the test database.

    Yields "127.0.0.1:<port>"; both processes are stopped when the block ends.
    """
    env = database_env_for_workers()
    port = free_port()
    web_log, worker_log = log_dir / f"web{tag}.log", log_dir / f"worker{tag}.log"
    with (
        running([sys.executable, "manage.py", "runstack", "--port", str(port)], env, web_log) as web,
        running(worker_command(f"w{tag}"), env, worker_log),
    ):
        wait_for_http(f"http://127.0.0.1:{port}/healthz", web, web_log)
        yield f"127.0.0.1:{port}"


@contextmanager
def served_embedded(root: Path, *setup: tuple[str, ...], env: dict[str, str] | None = None) -> Iterator:
    """A fresh embedded install in `root` (migrated — `migrate_embedded` — then each `setup` manage.py command run),
    served by `runstack` on a free port until the block ends.

    Yields `.base` ("http://127.0.0.1:<port>"), `.port`, `.log` and `.workspaces`.
    """
    from types import SimpleNamespace

    env = env or embedded_env(root)
    migrate_embedded(env)
    for command in setup:
        manage(env, *command)
    port = free_port()
    log = root / "runstack.log"
    with running([sys.executable, "manage.py", "runstack", "--port", str(port)], env, log) as proc:
        base = f"http://127.0.0.1:{port}"
        wait_for_http(f"{base}/healthz", proc, log)
        yield SimpleNamespace(base=base, port=port, log=log, workspaces=root / "workspaces")
