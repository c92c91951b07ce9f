"""Fifty Sessions on one real worker process (ARCHITECTURE §3: "waiting costs memory, not a worker").

One Celery worker (threads pool, concurrency 60) over Redis, PostgreSQL, and the scripted model
server answering every request in about a second. The inputs of all fifty Sessions are queued
before the worker starts, so it starts with a backlog of fifty (its start-up sweep wakes them a
second time, as it would after a deploy), and the test process sweeps at the beat's pace, as
production's beat would. Production's lease, pool and presence settings throughout.

- every Session reaches its first model call before any turn ends: fifty Sessions waiting on
  their model's stream hold fifty threads, not fifty turns in a row;
- the worker's database connections stay within its pool (XAGENT_WORKER_DB_CONNECTIONS) however
  many of those threads wait, counted in `pg_stat_activity` under an `application_name` of its own;
- a SIGKILL with fifty Sessions in flight loses no input and runs no side effect twice: an heir
  worker takes every Session over.

Tests assert counts and order of recorded facts, never how long something took.
"""

from __future__ import annotations

import threading
import time
import uuid
from urllib.parse import urlencode, urlsplit, urlunsplit

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.db.models import Count, Min

from approvals_app.models import ApprovalPolicy
from approvals_app.policy import ensure_default_policy
from sessions_app.models import Input, ModelCall, Session, SessionEvent, Turn
from sessions_app.runtime import brain, engine
from tests.runtime.helpers import assert_gap_free, assert_tool_pairs
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.models import Tool, ToolSet

from .processes import database_env_for_workers, running, worker_command

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

SESSIONS = 50
CONCURRENCY = 60
# About a second per answer: a pause before the first byte, then a few streamed chunks (each
# chunk is a delta the runner forwards, so the stream touches the database as a real one does).
MODEL_PACE = {"delay_before_s": 0.8, "delay_per_chunk_s": 0.05}


def _steps_done(request) -> tuple[str, int]:
    """(label of the turn's message, assistant answers since it): the model answers from the
    request alone, so any worker can continue any Session."""
    messages = request.messages
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    label = messages[last_user]["content"].split()[-1]
    return label, sum(1 for m in messages[last_user + 1 :] if m["role"] == "assistant")


def _post_sessions(api, title: str) -> list[str]:
    return [
        api.post("/api/v1/sessions/", {"title": f"{title} {n}"}, format="json").json()["id"]
        for n in range(SESSIONS)
    ]


def _send_all(api, ids: list[str]) -> None:
    for n, session_id in enumerate(ids):
        response = api.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": f"turn s{n}"}, format="json")
        assert response.status_code == 202, response.content


def _wait(predicate, proc, log, what: str, timeout: float = 150) -> None:
    """Poll `predicate` while the worker lives; meanwhile sweep as production's beat does (at its
    pace, XAGENT_RECOVERY_SWEEP_SECONDS: no test here runs a beat process)."""
    deadline = time.monotonic() + timeout
    next_sweep = time.monotonic() + settings.XAGENT_RECOVERY_SWEEP_SECONDS
    while not predicate():
        assert proc.poll() is None, f"worker exited:\n{log.read_text(errors='replace')[-4000:]}"
        assert time.monotonic() < deadline, (
            f"timed out waiting for {what}:\n{log.read_text(errors='replace')[-4000:]}"
        )
        if time.monotonic() >= next_sweep:
            brain.recover_stale_sessions()
            next_sweep = time.monotonic() + settings.XAGENT_RECOVERY_SWEEP_SECONDS
        time.sleep(0.2)


def _turns_ended(ids) -> int:
    return Turn.objects.filter(session_id__in=ids, ended_at__isnull=False).count()


def _assert_settled(session_id) -> None:
    """Nothing left behind: no queued input, no open turn or model call, valid history."""
    session = Session.objects.get(pk=session_id)
    assert not Input.objects.filter(session=session, status="queued").exists(), session_id
    assert Input.objects.filter(session=session, kind="message").count() == 1, session_id
    assert not Turn.objects.filter(session=session, ended_at__isnull=True).exists(), session_id
    assert not ModelCall.objects.filter(session=session, ended_at__isnull=True).exists(), session_id
    assert session.current_turn_id is None, session_id
    assert_tool_pairs(session)
    assert_gap_free(session)


class ConnectionSampler:
    """Counts, every few milliseconds, the backends in `pg_stat_activity` that carry
    `application_name` (on a connection of its own, so it never counts itself)."""

    def __init__(self, application_name: str, interval_s: float = 0.01):
        self.application_name = application_name
        self.interval_s = interval_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg-activity-sampler", daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> ConnectionSampler:
        db = connection.settings_dict
        self._conn = psycopg.connect(
            dbname=db["NAME"],
            host=db["HOST"] or None,
            port=db["PORT"] or None,
            user=db["USER"] or None,
            password=db["PASSWORD"] or None,
            autocommit=True,
        )
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._conn.close()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                row = self._conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name = %s",
                    [self.application_name],
                ).fetchone()
                self.samples.append(row[0])
                self._stop.wait(self.interval_s)
        except BaseException as exc:  # reported by the test, not lost in a thread
            self.error = exc

    @property
    def peak(self) -> int:
        return max(self.samples, default=0)


def _tagged_env(application_name: str) -> dict[str, str]:
    env = database_env_for_workers()
    parts = urlsplit(env["DATABASE_URL"])
    env["DATABASE_URL"] = urlunsplit(parts._replace(query=urlencode({"application_name": application_name})))
    return env


# --- fifty Sessions, a few read-only steps each ------------------------------------------------

READ_STEPS = 3


def listing_model(request):
    """READ_STEPS steps listing the workspace (a cheap native read-only tool), then the answer."""
    label, done = _steps_done(request)
    if done >= READ_STEPS:
        return text_reply(f"Turn {label}: the workspace is listed.", chunk_size=8, **MODEL_PACE)
    return tool_reply(tool_call("fs_list", {"path": "."}), **MODEL_PACE)


def _run_fifty_listing_turns(tmp_path, api, model_server, tag: str) -> tuple[list[str], ConnectionSampler]:
    """Queue one message in each of fifty Sessions, then run one worker until every turn ended,
    sampling the worker's database connections all along."""
    model_server.default("agent", listing_model)
    ids = _post_sessions(api, tag)
    _send_all(api, ids)  # all fifty tasks wait in the broker before the worker starts
    application_name = f"xagent-many-{uuid.uuid4().hex[:8]}"
    log = tmp_path / f"{tag}.log"
    with (
        ConnectionSampler(application_name) as sampler,
        running(worker_command(tag, concurrency=CONCURRENCY), _tagged_env(application_name), log) as worker,
    ):
        _wait(lambda: _turns_ended(ids) == SESSIONS, worker, log, "fifty turns to end")
    assert sampler.error is None, repr(sampler.error)
    return ids, sampler


def test_fifty_sessions_with_a_one_second_model_all_reach_their_first_model_call_before_any_turn_ends(
    tmp_path, api_owner_a, model_config_a, model_server
):
    ids, _ = _run_fifty_listing_turns(tmp_path, api_owner_a, model_server, "many")

    first_calls = dict(
        ModelCall.objects.filter(session_id__in=ids)
        .values("session_id")
        .annotate(first=Min("started_at"))
        .values_list("session_id", "first")
    )
    first_end = Turn.objects.filter(session_id__in=ids).aggregate(first=Min("ended_at"))["first"]
    late = sorted(str(sid) for sid, first in first_calls.items() if first >= first_end)
    print(
        f"first model calls from {min(first_calls.values())} to {max(first_calls.values())}; "
        f"first turn ended at {first_end}"
    )
    assert len(first_calls) == SESSIONS
    # Not one Session waited for another's turn: all fifty were waiting on their model at once.
    assert not late, f"{len(late)} Sessions made their first model call only after a turn had ended"

    turns = list(Turn.objects.filter(session_id__in=ids).values_list("session_id", "reason"))
    assert len(turns) == SESSIONS and {reason for _, reason in turns} == {"completed"}, turns
    calls = dict(
        ModelCall.objects.filter(session_id__in=ids)
        .values("session_id")
        .annotate(n=Count("id"))
        .values_list("session_id", "n")
    )
    assert set(calls.values()) == {READ_STEPS + 1}, calls  # each tool step and the answer, once
    for session_id in ids:
        _assert_settled(session_id)
        assert Session.objects.get(pk=session_id).status == "idle"


def test_bounded_database_connections_while_fifty_sessions_wait(
    tmp_path, api_owner_a, model_config_a, model_server
):
    ids, sampler = _run_fifty_listing_turns(tmp_path, api_owner_a, model_server, "bounded")

    pool = settings.XAGENT_WORKER_DB_CONNECTIONS
    print(f"worker connections in pg_stat_activity: peak {sampler.peak} over {len(sampler.samples)} samples")
    assert sampler.peak >= 1  # the tag reached pg_stat_activity: the count measures the worker
    # No allowance on top of the pool: runner threads, the watcher and presence all take their
    # connections from it. Measured: a peak of exactly 2 in every run; with the pool turned off
    # (XAGENT_DB_POOL_SIZE=0) the same run peaks at 60, one connection per thread.
    assert sampler.peak <= pool, sampler.peak
    assert Turn.objects.filter(session_id__in=ids, reason="completed").count() == SESSIONS
    for session_id in ids:
        _assert_settled(session_id)


# --- a SIGKILL with fifty Sessions in flight ------------------------------------------------------

SHELL_STEPS = 3
KILL_AT_STARTED = 40  # Sessions with at least one model call when the worker is killed


def appending_model(request):
    """Step n of a turn appends `<label>-<n>` to side.log (a side effect that must never run twice)."""
    label, done = _steps_done(request)
    if done >= SHELL_STEPS:
        return text_reply(f"Turn {label} finished.", chunk_size=8, **MODEL_PACE)
    command = f"echo {label}-{done} >> side.log"
    return tool_reply(tool_call("shell_exec", {"command": command, "timeout_seconds": 30}), **MODEL_PACE)


def test_killing_a_worker_with_fifty_sessions_in_flight_loses_none_and_runs_none_twice(
    tmp_path, api_owner_a, tenant_a, model_config_a, model_server
):
    shell = ToolSet.objects.create(tenant=tenant_a, name="shell", is_default=True)
    shell.tools.add(Tool.objects.get(tenant=None, name="shell_exec"))
    ensure_default_policy(tenant_a)
    ApprovalPolicy.objects.filter(tenant=tenant_a).update(enabled=False)  # no approval stop here
    model_server.default("agent", appending_model)
    # Production's lease (XAGENT_RUNNER_LEASE_SECONDS): the heir takes the dead worker's Sessions
    # over through presence (its pid is gone), not by waiting for their leases to lapse.
    env = database_env_for_workers()
    ids = _post_sessions(api_owner_a, "killed")
    _send_all(api_owner_a, ids)

    def started() -> int:
        return ModelCall.objects.filter(session_id__in=ids).values("session_id").distinct().count()

    log = tmp_path / "doomed.log"
    with running(worker_command("doomed", concurrency=CONCURRENCY), env, log) as doomed:
        _wait(lambda: started() >= KILL_AT_STARTED, doomed, log, "Sessions to reach the model")
        doomed.kill()  # SIGKILL: no cleanup, no release; fifty leases stay taken
        doomed.wait(timeout=10)
    at_kill = {
        "started": started(),
        "open turns": Turn.objects.filter(session_id__in=ids, ended_at__isnull=True).count(),
        "ended turns": _turns_ended(ids),
        "open model calls": ModelCall.objects.filter(session_id__in=ids, ended_at__isnull=True).count(),
    }

    def all_done() -> bool:
        return (
            not Input.objects.filter(session_id__in=ids, status="queued").exists()
            and not Turn.objects.filter(session_id__in=ids, ended_at__isnull=True).exists()
            and _turns_ended(ids) == SESSIONS
        )

    log = tmp_path / "heir.log"
    with running(worker_command("heir", concurrency=CONCURRENCY), env, log) as heir:
        _wait(all_done, heir, log, "every Session to finish after the kill")

    recovered = SessionEvent.objects.filter(session_id__in=ids, type="session.recovered")
    print(f"at the kill: {at_kill}; session.recovered events: {recovered.count()}")
    assert at_kill["open turns"] >= 1  # the kill landed in work in progress
    assert recovered.exists()
    outcomes = {}
    for n, session_id in enumerate(ids):
        session = Session.objects.get(pk=session_id)
        (turn,) = Turn.objects.filter(session=session)
        outcomes[turn.reason] = outcomes.get(turn.reason, 0) + 1
        assert turn.reason in ("completed", "interrupted") or session.status == "interrupted", (
            session_id,
            session.status,
            turn.reason,
            turn.reason_detail,
        )
        _assert_settled(session_id)
        side = engine.workspace_path(session) / "side.log"
        lines = side.read_text().split() if side.exists() else []
        assert len(lines) == len(set(lines)), f"{session_id}: a side effect ran twice: {lines}"
        assert set(lines) <= {f"s{n}-{step}" for step in range(SHELL_STEPS + 10)}, (session_id, lines)
    print(f"turn outcomes: {outcomes}")
