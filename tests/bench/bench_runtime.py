"""`make bench`: figures, not assertions. Harness overhead per step and queries per step as
history grows, with the model replaced by the scripted server on loopback (its own cost is
part of the figure: one local HTTP round trip per step)."""

import statistics
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sessions_app.runtime import brain, engine
from sessions_app.runtime.agent import AgentService
from tests.runtime.helpers import new_session, send
from tests.support.model_server import tool_call, tool_reply

pytestmark = pytest.mark.django_db(transaction=True)

STEPS = 300


def test_step_overhead_and_queries_by_history_length(
    tenant_a, owner_a, model_config_a, model_server, settings
):
    settings.XAGENT_MAX_STEPS_PER_TURN = STEPS + 10
    model_server.default("agent", lambda request: tool_reply([tool_call("fs_list", {})]))
    session = new_session(tenant_a, owner_a)
    send(session, "list forever")
    token = brain.acquire(session.pk)
    turn = engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    agent = AgentService(session.pk, token)
    agent.prepare(turn.pk)
    queries, millis = {}, {}
    for step in range(1, STEPS + 1):
        started = time.perf_counter()
        connection.queries_log.clear()  # the log is capped at 9000 entries
        with CaptureQueriesContext(connection) as captured:
            agent.step()
        millis[step] = (time.perf_counter() - started) * 1000
        queries[step] = len(captured)
        if step == STEPS:
            turn.refresh_from_db()
            print(
                f"\n[bench] turn after {STEPS} steps: reason={turn.reason or 'open'} steps={turn.steps} {turn.reason_detail}"
            )
    vendor = connection.vendor
    print(f"\n[bench] database: {vendor}; one step = assemble + model call (loopback) + 1 tool + commits")
    for window in ((1, 10), (91, 100), (STEPS - 9, STEPS)):
        sample = [millis[s] for s in range(window[0], window[1] + 1)]
        history = 1 + 2 * window[1]
        print(
            f"[bench] steps {window[0]:>3}-{window[1]:>3} (history ~{history:>3} messages): "
            f"{statistics.median(sample):6.1f} ms/step median, queries/step {queries[window[1]]}"
        )
