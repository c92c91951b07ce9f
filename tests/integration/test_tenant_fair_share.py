"""XAGENT_TENANT_MAX_RUNNING on a real worker process (Celery threads pool over Redis, PostgreSQL):
one tenant cannot take every thread of a worker.

Tenant A submits 16 Sessions at once, then tenant B one; the worker could drive 30 at once, A may
run 4. Each turn is one ~1 s model call. Checked from the committed evidence (counts and order,
not durations): no more than 4 of A's model calls were ever in flight together, A's others waited
`queued` with the reason `tenant_limit`, B did not wait behind A's line, and every Session
completed its turn, driven only by the product's own wake-ups (no recovery sweep runs here).
"""

from __future__ import annotations

import time

import pytest

from sessions_app.models import Input, ModelCall, Session, SessionEvent, Turn
from tests.support.model_server import text_reply

from .processes import database_env_for_workers, running, worker_command

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

LIMIT = 4
A_SESSIONS = 16


def most_at_once(intervals: list[tuple]) -> int:
    """The most intervals (start, end) open at one instant (an end before a start at a tie)."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    open_now = peak = 0
    for _, step in edges:
        open_now += step
        peak = max(peak, open_now)
    return peak


def run_fair_share(tmp_path, api_owner_a, api_outsider_b, model_server) -> tuple[list[str], str]:
    """Tenant A submits A_SESSIONS Sessions (one ~1 s model call each), then tenant B one, on one
    worker that could drive 30 at once; returns (A's ids, B's id) once every turn ended."""
    model_server.default("agent", text_reply("Done.", delay_before_s=1.0))
    a_ids = [
        api_owner_a.post("/api/v1/sessions/", {"title": f"a{n}"}, format="json").json()["id"]
        for n in range(A_SESSIONS)
    ]
    b_id = api_outsider_b.post("/api/v1/sessions/", {"title": "b"}, format="json").json()["id"]
    env = {**database_env_for_workers(), "XAGENT_TENANT_MAX_RUNNING": str(LIMIT)}
    log = tmp_path / "worker.log"
    everyone = [*a_ids, b_id]

    with running(worker_command("fairshare", concurrency=30), env, log) as worker:
        for session_id in a_ids:
            response = api_owner_a.post(
                f"/api/v1/sessions/{session_id}/inputs/", {"text": "go"}, format="json"
            )
            assert response.status_code == 202
        response = api_outsider_b.post(f"/api/v1/sessions/{b_id}/inputs/", {"text": "go"}, format="json")
        assert response.status_code == 202

        # No recovery sweep runs here: the runners' own wake-ups must drain A's line.
        deadline = time.monotonic() + 120
        while Turn.objects.filter(session_id__in=everyone, ended_at__isnull=False).count() < len(everyone):
            assert worker.poll() is None, log.read_text(errors="replace")[-4000:]
            if time.monotonic() > deadline:
                stuck = list(
                    Session.objects.filter(pk__in=everyone)
                    .exclude(status="idle")
                    .values_list("pk", "status", "status_reason", "runner_token")
                )
                raise AssertionError(f"not every Session finished: {stuck}\n{log.read_text()[-4000:]}")
            time.sleep(0.2)
    return a_ids, b_id


def a_model_calls(a_ids) -> list[tuple]:
    """(session id, started, ended) of A's model calls, in the order they started."""
    calls = list(
        ModelCall.objects.filter(session_id__in=a_ids)
        .order_by("started_at")
        .values_list("session_id", "started_at", "ended_at")
    )
    assert len(calls) == A_SESSIONS and all(ended is not None for _, _, ended in calls)
    return calls


def test_one_tenant_cannot_take_every_place_and_every_session_completes(
    tmp_path, tenant_a, tenant_b, api_owner_a, api_outsider_b, model_config_a, model_config_b, model_server
):
    a_ids, b_id = run_fair_share(tmp_path, api_owner_a, api_outsider_b, model_server)

    # Every Session completed its one turn; nothing is left queued or leased.
    for session_id in [*a_ids, b_id]:
        session = Session.objects.get(pk=session_id)
        assert (session.status, session.status_reason, session.runner_token) == ("idle", "", None)
        assert list(Turn.objects.filter(session=session).values_list("reason", flat=True)) == ["completed"]
        assert not Input.objects.filter(session=session, status="queued").exists()
    a_calls = a_model_calls(a_ids)

    # A model call runs inside its runner's lease: A never had more than LIMIT at once (and did
    # reach it: the limit, not the worker, was what held A back).
    assert most_at_once([(started, ended) for _, started, ended in a_calls]) == LIMIT

    # A's others waited as `queued` with the reason (then ran: all are idle above).
    queued = SessionEvent.objects.filter(
        session_id__in=a_ids, type="session.status", data={"status": "queued", "reason": "tenant_limit"}
    )
    waited = set(queued.values_list("session_id", flat=True))
    assert len(waited) >= A_SESSIONS - 2 * LIMIT, len(waited)
    assert not SessionEvent.objects.filter(
        session_id=b_id, type="session.status", data__status="queued"
    ).exists()

    # B, submitted after all of A, started before A's last Session got its first model call.
    b_first = ModelCall.objects.filter(session_id=b_id).order_by("started_at").first().started_at
    a_first = [started for _, started, _ in a_calls]
    assert b_first < a_first[-1]
    assert sum(1 for started in a_first if started > b_first) >= LIMIT
