"""20 concurrent long polls on the real stack hold no database connections while they wait.

daphne (runstack) + a Celery worker + Redis (channel layer, cache) + PostgreSQL. The web
process tags its connections with an `application_name`, so `pg_stat_activity` shows
exactly which backends daphne holds while the polls wait; then one input wakes them all.
Its connection pool is bounded at WEB_POOL (fewer than the polls): were a waiting poll to keep a
connection, the other polls and the waking input would queue behind it instead of being served.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from urllib.parse import urlencode, urlsplit, urlunsplit

import httpx2 as httpx
import pytest
from django.db import connection

from tenancy_app.models import ApiKey
from tenancy_app.throttling import long_poll_slots_held
from tests.support.model_server import text_reply

from .processes import (
    database_env_for_workers,
    free_port,
    running,
    wait_for_http,
    worker_command,
)

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

POLLS = 20
WEB_POOL = 3
WEB_APP_NAME = "xagent-longpoll-web"


@contextmanager
def _stack(tmp_path):
    env = database_env_for_workers()
    env["XAGENT_WORKSPACES_DIR"] = str(tmp_path / "workspaces")
    env["XAGENT_LONG_POLL_MAX_PER_KEY"] = str(POLLS)
    web_env = dict(env, XAGENT_DB_POOL_SIZE=str(WEB_POOL))
    parts = urlsplit(env["DATABASE_URL"])
    web_env["DATABASE_URL"] = urlunsplit(parts._replace(query=urlencode({"application_name": WEB_APP_NAME})))
    port = free_port()
    web_log, worker_log = tmp_path / "web.log", tmp_path / "worker.log"
    with (
        running([sys.executable, "manage.py", "runstack", "--port", str(port)], web_env, web_log) as web,
        running(worker_command("longpoll"), env, worker_log),
    ):
        wait_for_http(f"http://127.0.0.1:{port}/healthz", web, web_log)
        yield f"127.0.0.1:{port}", web


def _web_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            [WEB_APP_NAME],
        )
        return cursor.fetchone()[0]


def _settle(limit: int, deadline_s: float = 10) -> int:
    """A closed connection's backend leaves pg_stat_activity a moment after the client lets go."""
    deadline = time.monotonic() + deadline_s
    count = _web_connections()
    while count > limit and time.monotonic() < deadline:
        time.sleep(0.05)
        count = _web_connections()
    return count


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return int(next(line for line in status if line.startswith("Threads:")).split()[1])


def test_twenty_waiting_long_polls_hold_no_database_connection_and_one_input_wakes_them(
    tmp_path, api_owner_a, model_config_a, model_server, settings
):
    settings.XAGENT_LONG_POLL_MAX_PER_KEY = POLLS  # so this process counts the web process's slots
    model_server.script("agent", text_reply("Noted."))
    key = api_owner_a.api_key
    ident = f"key:{ApiKey.objects.get(prefix=key.split('_')[1]).pk}"
    with _stack(tmp_path) as (address, web):
        api = httpx.Client(
            base_url=f"http://{address}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30
        )
        session_id = api.post("/sessions/", json={"title": "long polls"}).json()["id"]
        last = api.get(f"/sessions/{session_id}/events/").json()["last_seq"]
        idle = _settle(0)  # an idle web process, right after answering requests
        idle_threads = _threads(web.pid)

        results: list = [None] * POLLS

        def poll(index: int) -> None:
            try:
                with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=30) as client:
                    response = client.get(
                        f"http://{address}/api/v1/sessions/{session_id}/events/",
                        params={"after": last, "wait": 10},
                    )
                    results[index] = (response.status_code, response.json())
            except Exception as exc:  # reported by the assertions below, not lost in a thread
                results[index] = (repr(exc), {})

        pollers = [threading.Thread(target=poll, args=(n,)) for n in range(POLLS)]
        for thread in pollers:
            thread.start()
        deadline = time.monotonic() + 8
        while long_poll_slots_held(ident) < POLLS and time.monotonic() < deadline:
            time.sleep(0.02)
        held_slots = long_poll_slots_held(ident)
        _settle(idle, deadline_s=3)
        during = []
        for _ in range(10):  # over half a second, all 20 still waiting
            during.append(_web_connections())
            time.sleep(0.05)
        waiting_threads = _threads(web.pid)
        still_waiting = sum(1 for r in results if r is None)

        queued = api.post(f"/sessions/{session_id}/inputs/", json={"text": "wake everyone"})
        for thread in pollers:
            thread.join(timeout=30)
        api.close()

    print(
        f"pg_stat_activity for daphne: idle={idle}, during {POLLS} waits={during}; "
        f"daphne threads: idle={idle_threads}, waiting={waiting_threads}"
    )
    assert held_slots == POLLS and still_waiting == POLLS
    # Pooled connections stay open between requests; while 20 polls wait, no more are opened.
    assert max(during) <= max(idle, WEB_POOL)
    assert queued.status_code == 202
    for status, body in results:
        assert status == 200
        assert body["events"][0]["seq"] == last + 1 and body["events"][0]["type"] == "input.queued"
        assert body["last_seq"] >= last + 1
    assert long_poll_slots_held(ident) == 0
