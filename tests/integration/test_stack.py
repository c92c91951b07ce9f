"""The two ways to run (ARCHITECTURE §9), each proven with a `config.ping` round trip."""

import sys
import time
import uuid

import httpx2 as httpx
import pytest
from django.core.cache import cache

from config.celery import PING_CACHE_PREFIX, ping

from .processes import embedded_env, free_port, manage, running, wait_for_http


def test_runstack_serves_web_and_runs_tasks_in_process(tmp_path):
    """Embedded mode: one `runstack` process answers HTTP and consumes Celery tasks itself."""
    env = embedded_env(tmp_path)
    manage(env, "migrate", "--noinput", "-v0")
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
    assert f"running at http://127.0.0.1:{port}/" in log.read_text()


@pytest.mark.services
def test_ping_runs_on_a_separate_celery_worker_over_redis(tmp_path, settings):
    """Production mode: a task sent through Redis is consumed by a separate `celery worker` process."""
    assert settings.CELERY_BROKER_URL.startswith("redis://")
    log = tmp_path / "worker.log"
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "config",
        "worker",
        "--pool",
        "threads",
        "--concurrency",
        "2",
        "--loglevel",
        "INFO",
        "--hostname",
        f"ping-{uuid.uuid4().hex[:8]}@%h",
        "--without-mingle",
        "--without-gossip",
    ]
    import os

    with running(cmd, dict(os.environ), log) as proc:
        nonce = uuid.uuid4().hex
        ping.delay(nonce)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and cache.get(PING_CACHE_PREFIX + nonce) != "pong":
            assert proc.poll() is None, log.read_text(errors="replace")
            time.sleep(0.1)
        assert cache.get(PING_CACHE_PREFIX + nonce) == "pong", log.read_text(errors="replace")
    assert "config.ping" in log.read_text()
