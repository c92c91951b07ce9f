"""Quotas on a real worker process (Celery threads pool over Redis, PostgreSQL), the model the
scripted server on loopback.

50 Sessions race against a tenant quota with one token left, each turn two model calls of 100
tokens. Every Session passes the check before its first call (nothing is spent yet) and none may
pass it before its second: the quota is overshot by at most one call per Session in flight, and
every Session waits `queued` with reason `quota_exceeded`, its turn open, nothing lost. Raising
the limit lets all of them finish, driven only by the product's own wake-up (no sweep runs)."""

from __future__ import annotations

import time

import pytest

from sessions_app.models import ModelCall, Quota, Session, Turn
from tests.support.model_server import text_reply, tool_call, tool_reply

from .processes import database_env_for_workers, running, worker_command

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

SESSIONS = 50
PER_CALL = {"prompt_tokens": 90, "completion_tokens": 10}
LIMIT = 1  # one token left


def two_calls(request):
    """A tool step, then the answer; calls overlap (each takes ~0.3 s)."""
    if any(m.get("role") == "tool" for m in request.messages):
        return text_reply("Listed.", usage=PER_CALL, delay_before_s=0.3)
    return tool_reply(tool_call("fs_list", {}), usage=PER_CALL, delay_before_s=0.3)


def wait_until(predicate, worker, log, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert worker.poll() is None, log.read_text(errors="replace")[-4000:]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}\n{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.2)


def test_fifty_sessions_racing_a_spent_quota_overshoot_by_at_most_one_call_each(
    tmp_path, tenant_a, api_owner_a, model_config_a, model_server
):
    quota = Quota.objects.create(tenant=tenant_a, period="day", max_tokens=LIMIT)
    model_server.default("agent", two_calls)
    ids = [
        api_owner_a.post("/api/v1/sessions/", {"title": f"s{n}"}, format="json").json()["id"]
        for n in range(SESSIONS)
    ]
    log = tmp_path / "worker.log"
    with running(
        worker_command("quota", concurrency=SESSIONS + 10), database_env_for_workers(), log
    ) as worker:
        for session_id in ids:
            response = api_owner_a.post(
                f"/api/v1/sessions/{session_id}/inputs/", {"text": "go"}, format="json"
            )
            assert response.status_code == 202, response.content

        def all_parked():
            return (
                Session.objects.filter(pk__in=ids, status="queued", status_reason="quota_exceeded").count()
                == SESSIONS
            )

        wait_until(all_parked, worker, log, "every Session is parked for the quota")
        calls = list(
            ModelCall.objects.filter(session_id__in=ids, purpose="agent").values_list("session_id", flat=True)
        )
        # At most one call each: nobody passed the check before a second call.
        assert len(calls) == len(set(calls)) <= SESSIONS
        used = sum(
            ModelCall.objects.filter(session_id__in=ids).values_list("prompt_tokens", flat=True)
        ) + sum(ModelCall.objects.filter(session_id__in=ids).values_list("completion_tokens", flat=True))
        assert used <= LIMIT + SESSIONS * (PER_CALL["prompt_tokens"] + PER_CALL["completion_tokens"])
        assert (
            Turn.objects.filter(session_id__in=ids, ended_at__isnull=True).count() == SESSIONS
        )  # open, kept

        quota.max_tokens = 10**9
        quota.save()  # committed: the parked Sessions are woken
        wait_until(
            lambda: Turn.objects.filter(session_id__in=ids, reason="completed").count() == SESSIONS,
            worker,
            log,
            "every turn completed after the raise",
        )
    assert set(Session.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"idle"}
    assert ModelCall.objects.filter(session_id__in=ids, purpose="agent").count() == 2 * SESSIONS
