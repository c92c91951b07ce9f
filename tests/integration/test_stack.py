"""The two ways to run (ARCHITECTURE §9), each proven with a `config.ping` round trip."""

import sys
import time
import uuid

import httpx2 as httpx
import pytest
from django.core.cache import cache

from config.celery import PING_CACHE_PREFIX, ping

from .processes import (
    database_env_for_workers,
    embedded_env,
    free_port,
    manage,
    migrate_embedded,
    running,
    wait_for_http,
    worker_command,
)


def test_runstack_serves_web_and_runs_tasks_in_process(tmp_path):
    """Embedded mode: one `runstack` process answers HTTP and consumes Celery tasks itself."""
    env = embedded_env(tmp_path)
    migrate_embedded(env)
    seeded = manage(env, "seed_demo").stdout
    assert "Login: demo / demo" in seeded

    port = free_port()
    log = tmp_path / "runstack.log"
    with running([sys.executable, "manage.py", "runstack", "--port", str(port)], env, log) as proc:
        base = f"http://127.0.0.1:{port}"
        health = wait_for_http(f"{base}/healthz?worker=1", proc, log).json()
        assert health == {"status": "ok", "database": "ok", "broker": "ok", "worker": "ok"}

        assert httpx.get(f"{base}/accounts/login/").status_code == 200
        assert httpx.get(f"{base}/admin/login/").status_code == 200
        assert httpx.get(f"{base}/static/admin/css/base.css").status_code == 200

        # The printed demo login works in the browser login form.
        with httpx.Client(base_url=base, follow_redirects=True) as browser:
            browser.get("/accounts/login/")
            page = browser.post(
                "/accounts/login/",
                data={
                    "username": "demo",
                    "password": "demo",
                    "csrfmiddlewaretoken": browser.cookies["csrftoken"],
                },
                headers={"Referer": f"{base}/accounts/login/"},
            )
            assert page.status_code == 200
            assert "Demo workspace" in page.text
            demo = _wait_for_demo_turn(browser)
    _assert_demo_report(tmp_path / "workspaces", demo)
    assert f"running at http://127.0.0.1:{port}/" in log.read_text()


def _wait_for_demo_turn(browser, timeout=90) -> dict:
    """The seeded demo Session runs on the in-process worker with the scripted demo model; it
    parks on the approval of its destructive clean-up, which the demo user approves here."""
    deadline = time.monotonic() + timeout
    approved = False
    while time.monotonic() < deadline:
        sessions = browser.get("/api/v1/sessions/").json()["results"]
        demo = next(s for s in sessions if s["title"].endswith("(demo)"))
        events = browser.get(f"/api/v1/sessions/{demo['id']}/events/?wait=2").json()["events"]
        requested = [e for e in events if e["type"] == "approval.requested"]
        if requested and not approved:
            assert (
                requested[0]["data"]["tool"] == "fs_delete_files"
                and requested[0]["data"]["risk"] == "destructive"
            )
            decided = browser.post(
                f"/api/v1/approvals/{requested[0]['data']['approval_id']}/decide/",
                json={"decision": "approve"},
                headers={"X-CSRFToken": browser.cookies["csrftoken"], "Referer": str(browser.base_url)},
            )
            assert decided.status_code == 200, decided.text
            approved = True
        if any(e["type"] == "turn.ended" for e in events):
            ended = next(e for e in events if e["type"] == "turn.ended")
            assert ended["data"]["reason"] == "completed", events[-5:]
            assert demo["model_label"].startswith("demo model")
            return browser.get(f"/api/v1/sessions/{demo['id']}/").json()
        time.sleep(0.5)
    raise AssertionError("the demo turn did not finish")


def _assert_demo_report(workspaces, demo):
    """report.html and kpis.csv hold the KPIs recomputed here with a CSV parser."""
    import csv
    import statistics

    (workspace,) = list(workspaces.glob(f"*/{demo['id']}"))
    rows = list(csv.DictReader((workspace / "tickets.csv").open()))
    resolved = [r for r in rows if r["status"] == "resolved"]
    expected = {
        "tickets_total": str(len(rows)),
        "tickets_resolved": str(len(resolved)),
        "tickets_escalated": str(sum(r["status"] == "escalated" for r in rows)),
        "avg_csat": str(round(statistics.mean(int(r["csat"]) for r in resolved), 2)),
        "avg_first_response_minutes": str(
            round(statistics.mean(float(r["first_response_minutes"]) for r in rows), 1)
        ),
    }
    kpis = {row["metric"]: row["value"] for row in csv.DictReader((workspace / "kpis.csv").open())}
    assert {k: kpis[k] for k in expected} == expected
    html = (workspace / "report.html").read_text()
    for value in expected.values():
        assert f"<td>{value}</td>" in html
    assert not (workspace / "draft_to_delete.md").exists()  # deleted once approved


@pytest.mark.services
@pytest.mark.django_db(transaction=True)
def test_ping_runs_on_a_separate_celery_worker_over_redis(tmp_path, settings):
    """Production mode: a task sent through Redis is consumed by a separate `celery worker` process."""
    assert settings.CELERY_BROKER_URL.startswith("redis://")
    log = tmp_path / "worker.log"
    with running(worker_command("ping"), database_env_for_workers(), log) as proc:
        nonce = uuid.uuid4().hex
        ping.delay(nonce)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and cache.get(PING_CACHE_PREFIX + nonce) != "pong":
            assert proc.poll() is None, log.read_text(errors="replace")
            time.sleep(0.1)
        assert cache.get(PING_CACHE_PREFIX + nonce) == "pong", log.read_text(errors="replace")
    assert "config.ping" in log.read_text()


def test_embedded_stack_streams_live_events_from_the_in_process_worker(tmp_path):
    """The worker thread's broadcasts reach daphne's WebSocket consumers (thread-safe in-memory layer)."""
    import json

    from websockets.sync.client import connect

    env = embedded_env(tmp_path)
    migrate_embedded(env)
    manage(env, "seed_demo")
    key = manage(env, "create_api_key", "--tenant", "demo", "--user", "demo").stdout.strip()
    port = free_port()
    log = tmp_path / "runstack.log"
    with running([sys.executable, "manage.py", "runstack", "--port", str(port)], env, log) as proc:
        wait_for_http(f"http://127.0.0.1:{port}/healthz", proc, log)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}/api/v1", headers={"Authorization": f"Bearer {key}"}
        ) as api:
            session_id = api.post("/sessions/", json={"title": "live demo"}).json()["id"]
            with connect(f"ws://127.0.0.1:{port}/ws/sessions/{session_id}/?token={key}") as ws:
                assert api.post(f"/sessions/{session_id}/inputs/", json={"text": "hello"}).status_code == 202
                frames = []
                while not frames or frames[-1]["type"] != "turn.ended":
                    frames.append(json.loads(ws.recv(timeout=30)))
    deltas = "".join(f["data"]["text"] for f in frames if f["type"] == "model.delta")
    assert "demo model" in deltas  # streamed live, before the message was committed
    logged = [f["seq"] for f in frames if f["seq"] is not None]
    assert logged == list(range(1, logged[-1] + 1))
    assert frames[-1]["data"]["reason"] == "completed"
