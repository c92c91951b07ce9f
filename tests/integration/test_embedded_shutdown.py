"""Stopping `runstack` (embedded mode) while a turn runs: the in-process worker stops quietly
(no traceback, no "cannot schedule new futures after ... shutdown"), and the next start finishes
the turn and the input queued behind it, running nothing twice.

Before: daphne returned, the interpreter began to exit, and the worker thread, still consuming,
handed the Session a yielding slice re-enqueued to an executor already shut down."""

import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing

import httpx2 as httpx

from tests.support.model_server import ScriptedModelServer, text_reply, tool_call, tool_reply

from .processes import PROJECT_ROOT, embedded_env, free_port, manage, migrate_embedded, wait_for_http

STEPS = 12  # more than one slice (brain.SLICE_MAX_STEPS = 8), so a slice yields mid-turn


def wait_for(predicate, what: str, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _install(tmp_path, server: ScriptedModelServer, **extra: str) -> tuple[dict, str]:
    env = embedded_env(tmp_path)
    env.update(OPENAI_BASE_URL=server.base_url, OPENAI_API_KEY="test-key", **extra)
    migrate_embedded(env)
    manage(env, "create_tenant", "acme")
    manage(env, "create_user", "alice", "--tenant", "acme", "--role", "owner", "--password", "pw-3141-alice")
    key = manage(env, "create_api_key", "--tenant", "acme", "--user", "alice").stdout.strip()
    return env, key


def _start(env: dict, log_path, port: int) -> subprocess.Popen:
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runstack", "--port", str(port)],
            cwd=PROJECT_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    wait_for_http(f"http://127.0.0.1:{port}/healthz", proc, log_path)
    return proc


def _stop(proc: subprocess.Popen, sig=signal.SIGTERM) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("runstack did not exit") from None


def _rows(tmp_path, sql: str, *params) -> list[tuple]:
    with closing(sqlite3.connect(tmp_path / "db.sqlite3")) as db:
        return db.execute(sql, params).fetchall()


def _turns(tmp_path, session_id: str) -> list[tuple]:
    return _rows(
        tmp_path,
        "SELECT number, reason FROM sessions_app_turn WHERE session_id = ? ORDER BY number",
        session_id.replace("-", ""),
    )


def _assert_quiet(log_text: str) -> None:
    assert "Traceback" not in log_text, log_text
    assert "cannot schedule new futures" not in log_text, log_text
    assert "CRITICAL" not in log_text, log_text


def _begin(port: int, key: str) -> str:
    with httpx.Client(
        base_url=f"http://127.0.0.1:{port}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as api:
        session_id = api.post("/sessions/", json={"title": "busy"}).json()["id"]
        assert (
            api.post(f"/sessions/{session_id}/inputs/", json={"text": "write the files"}).status_code == 202
        )
        assert api.post(f"/sessions/{session_id}/inputs/", json={"text": "then say hi"}).status_code == 202
    return session_id


def test_stopping_runstack_mid_turn_is_quiet_and_the_next_start_finishes_the_work(tmp_path):
    with ScriptedModelServer() as server:
        server.script(
            "agent",
            *[
                # Each step takes a moment, so the stop lands mid-turn however fast the machine is.
                tool_reply(
                    [tool_call("fs_write", {"path": f"f{i}.txt", "content": str(i)}, id=f"w{i}")],
                    delay_before_s=0.3,
                )
                for i in range(STEPS)
            ],
            text_reply("All files written."),
            text_reply("Hi."),
        )
        env, key = _install(tmp_path, server)
        first_log, second_log = tmp_path / "runstack1.log", tmp_path / "runstack2.log"

        port = free_port()
        proc = _start(env, first_log, port)
        session_id = _begin(port, key)
        wait_for(lambda: len(server.requests_for("agent")) >= 3, "the turn to be under way")
        assert _stop(proc) == 0
        _assert_quiet(first_log.read_text(errors="replace"))
        asked_before_restart = len(server.requests_for("agent"))
        assert asked_before_restart < STEPS + 2  # the work really was cut short

        port = free_port()
        proc = _start(env, second_log, port)
        try:
            wait_for(
                lambda: [r for _, r in _turns(tmp_path, session_id)] == ["completed", "completed"],
                "both turns",
            )
        finally:
            assert _stop(proc) == 0
        _assert_quiet(second_log.read_text(errors="replace"))

    # Every scripted reply was used exactly once: no step was asked twice, none was skipped.
    assert len(server.requests_for("agent")) == STEPS + 2
    workspace = next((tmp_path / "workspaces").rglob("f0.txt")).parent
    assert sorted(p.name for p in workspace.glob("f*.txt")) == sorted(f"f{i}.txt" for i in range(STEPS))
    results = _rows(
        tmp_path,
        "SELECT tool_call_id, is_error FROM sessions_app_message WHERE role = 'tool' ORDER BY id",
    )
    assert results == [(f"w{i}", False) for i in range(STEPS)]
    assert _rows(tmp_path, "SELECT status FROM sessions_app_input ORDER BY id") == [
        ("consumed",),
        ("consumed",),
    ]


def test_a_step_longer_than_the_shutdown_wait_is_left_for_recovery_quietly(tmp_path):
    with ScriptedModelServer() as server:
        server.script(
            "agent",
            text_reply("This answer never arrives.", delay_before_s=30),
            text_reply("Answered after the restart."),
            text_reply("Hi."),
        )
        env, key = _install(
            tmp_path, server, XAGENT_WORKER_SOFT_SHUTDOWN_SECONDS="1", XAGENT_RUNNER_LEASE_SECONDS="3"
        )
        first_log, second_log = tmp_path / "runstack1.log", tmp_path / "runstack2.log"

        port = free_port()
        proc = _start(env, first_log, port)
        session_id = _begin(port, key)
        wait_for(lambda: len(server.requests_for("agent")) == 1, "the slow model call")
        assert _stop(proc) == 0
        first = first_log.read_text(errors="replace")
        _assert_quiet(first)
        assert "left for recovery at the next start" in first

        port = free_port()
        proc = _start(env, second_log, port)
        try:
            wait_for(
                lambda: [r for _, r in _turns(tmp_path, session_id)] == ["completed", "completed"],
                "both turns",
            )
        finally:
            assert _stop(proc) == 0
        _assert_quiet(second_log.read_text(errors="replace"))

    assert len(server.requests_for("agent")) == 3
    recovered = _rows(
        tmp_path,
        "SELECT COUNT(*) FROM sessions_app_sessionevent WHERE session_id = ? AND type = 'session.recovered'",
        session_id.replace("-", ""),
    )
    assert recovered == [(1,)]  # the taker-over closed the model call the stopped process left open
