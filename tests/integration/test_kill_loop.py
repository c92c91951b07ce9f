"""Issue #11 acceptance: workers killed (SIGKILL) at random points while ten Sessions run
side-effecting turns. Every Session ends valid, no input is lost, no side effect happens twice.

Each Session gets two messages (the second queued while the first turn runs). The model (the
scripted server, answering from the request alone, so any worker can continue any Session) asks
for STEPS shell calls per turn, each appending a unique line to `side.log` in the workspace; a
call the runner lost before its result was committed is closed `interrupted` and never re-run,
so every line appears at most once. The kill times are random; the seed is in the failure.
"""

import random
import time

import pytest
from django.utils import timezone

from approvals_app.models import ApprovalPolicy
from approvals_app.policy import ensure_default_policy
from sessions_app.models import Checkpoint, Input, ModelCall, RunnerSlice, Session, SessionEvent, Turn
from sessions_app.runtime import brain, engine
from tests.runtime.helpers import assert_gap_free, assert_tool_pairs
from tests.support.model_server import text_reply, tool_call, tool_reply
from tools_app.models import Tool, ToolSet

from .processes import database_env_for_workers, running, worker_command

pytestmark = [pytest.mark.services, pytest.mark.django_db(transaction=True)]

SESSIONS, STEPS, KILLS = 10, 5, 2
LEASE_SECONDS = 3


def scripted_model(request):
    """Step n of a turn (n = assistant answers since the turn's message) appends `<turn>-<n>`."""
    messages = request.messages
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    label = messages[last_user]["content"].split()[-1]
    done = sum(1 for m in messages[last_user + 1 :] if m["role"] == "assistant")
    if done >= STEPS:
        return text_reply(f"Turn {label} finished.")
    pause = random.choice(["0", "0.2", "0.5", "1"])
    command = f"echo {label}-{done} >> side.log; sleep {pause}"
    return tool_reply(tool_call("shell_exec", {"command": command, "timeout_seconds": 30}))


def test_random_kills_leave_every_session_valid_with_no_lost_input_and_no_double_effect(
    tmp_path, api_owner_a, tenant_a, model_config_a, model_server
):
    seed = int(time.time())
    rng = random.Random(seed)
    shell = ToolSet.objects.create(tenant=tenant_a, name="shell", is_default=True)
    shell.tools.add(Tool.objects.get(tenant=None, name="shell_exec"))
    ensure_default_policy(tenant_a)
    ApprovalPolicy.objects.filter(tenant=tenant_a).update(enabled=False)
    model_server.default("agent", scripted_model)
    env = {**database_env_for_workers(), "XAGENT_RUNNER_LEASE_SECONDS": str(LEASE_SECONDS)}

    ids = [
        api_owner_a.post("/api/v1/sessions/", {"title": f"kill {n}"}, format="json").json()["id"]
        for n in range(SESSIONS)
    ]

    def all_done() -> bool:
        brain.recover_stale_sessions()  # what the periodic sweep does
        return (
            not Input.objects.filter(session_id__in=ids, status="queued").exists()
            and not Turn.objects.filter(session_id__in=ids, ended_at__isnull=True).exists()
        )

    for session_id in ids:
        api_owner_a.post(f"/api/v1/sessions/{session_id}/inputs/", {"text": "turn A"}, format="json")
    for kill in range(KILLS):
        log = tmp_path / f"doomed{kill}.log"
        round_started = timezone.now()
        with running(worker_command(f"doomed{kill}"), env, log) as doomed:
            # The random point is counted from the worker's first slice, not from its start (a
            # loaded machine may take seconds to boot it): the kill lands in work in progress.
            deadline = time.monotonic() + 60
            while not RunnerSlice.objects.filter(session_id__in=ids, started_at__gte=round_started).exists():
                assert doomed.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.05)
            if kill == 0:
                for session_id in ids:  # queued behind the running turn: must never be lost
                    api_owner_a.post(
                        f"/api/v1/sessions/{session_id}/inputs/", {"text": "turn B"}, format="json"
                    )
            time.sleep(rng.uniform(0.2, 3.0))
            doomed.kill()
            doomed.wait(timeout=10)

    log = tmp_path / "heir.log"
    with running(worker_command("heir"), env, log) as heir:
        deadline = time.monotonic() + 240
        while not all_done():
            assert heir.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, f"seed {seed}: sessions did not finish"
            time.sleep(0.3)

    # The kills landed in work in progress (a runner was taken over with something open).
    assert SessionEvent.objects.filter(session_id__in=ids, type="session.recovered").exists(), f"seed {seed}"
    for session_id in ids:
        session = Session.objects.get(pk=session_id)
        context = f"seed {seed}, session {session_id}"
        details = list(Turn.objects.filter(session=session).values_list("reason", "reason_detail"))
        assert session.status == "idle", f"{context}: {session.status_reason}; turns {details}"
        assert session.current_turn_id is None, context
        turns = list(Turn.objects.filter(session=session).order_by("number"))
        assert [t.reason for t in turns] == ["completed", "completed"], context
        inputs = Input.objects.filter(session=session, kind="message")
        assert inputs.count() == 2 and not inputs.filter(status="queued").exists(), context
        assert not ModelCall.objects.filter(session=session, ended_at__isnull=True).exists(), context
        assert not Checkpoint.objects.filter(session=session, status="pending").exists(), context
        assert_tool_pairs(session)
        assert_gap_free(session)
        side = engine.workspace_path(session) / "side.log"
        lines = side.read_text().split() if side.exists() else []
        assert len(lines) == len(set(lines)), f"{context}: a side effect ran twice: {lines}"
        # Every step of both turns either ran once or was closed interrupted (never re-run).
        assert set(lines) <= {f"{label}-{n}" for label in "AB" for n in range(STEPS + 10)}, context
