"""N Sessions × 5 steps with a model that answers after 1 s: how many waits the runtime overlaps.

Every Session's ModelConfig points at the scripted OpenAI-compatible server
(tests/support/model_server.py) that this process serves on loopback, so each model call is a
real network wait, through the real `openai` client, in whichever process runs the step. Every
answer takes 1 s, its stream spread evenly over that second (first chunk after 1/k s, one more
every 1/k s, k = the response's SSE events). A turn is 5 model calls: 4 tool-call steps
(`fs_list`, a native read-only tool) and the final text answer. Each N is two tenants: a big one
and a small one (N = 50: 45 + 5; otherwise 10 small), the big one's messages queued first, all
queued at once.

* PostgreSQL + Redis (production mode): 2 `celery -A config worker` processes, each with the pool
  and concurrency the settings choose; messages queued with `brain.submit_input` from here.
  N = 50, 200, 1,000 (`--quick`: 50).
* SQLite (embedded mode): `manage.py runstack`, whose in-process worker runs the slices in the
  web process; messages posted to its REST API (a wake from this process would reach no worker).
  N = 50, 100 (`--quick`: 50).

Each run starts the stack afresh and warms it up (a few 1-step turns) before measuring. Per N:

* wall time: first message queued (`Input.created_at`) → last turn ended (`Turn.ended_at`);
* effective concurrency: agent model calls × 1 s / wall — how many 1 s waits were in flight on
  average (the measured model-seconds are in the details);
* model call as the runtime saw it: mean `ModelCall.ended_at − started_at`. The server answers in
  1 s (its own timings are in the details); more means the worker read the stream late;
* first model call p50/p95/max: per Session, its first `ModelCall.started_at` − its message's
  `Input.created_at`; the same for the small tenant's Sessions alone;
* worker CPU per model call: user + system CPU of the processes that run slices (and their
  children) from the first message queued to the last turn ended, over the agent model calls —
  steadier than the wall figures on a loaded machine, and what bounds them;
* worker RSS, peak: VmRSS of the worker processes and their children (embedded: runstack), summed,
  sampled every 100 ms; growth per Session in flight: (peak − idle after warm-up) / the most turns
  open at once (`Turn.started_at` → `ended_at`), in KiB;
* PostgreSQL connections, peak: `pg_stat_activity` rows of the benchmark's database (this process's
  own connection included, the poller's excluded), polled every 100 ms (PostgreSQL only).

A slow runtime cannot make this last: each N runs only if its estimate (from the concurrency
measured at the N before it) fits in what is left of BUDGET_S, and a run stops at the budget's
end (a first run's figures then cover what had happened by then, a repeat is dropped; larger N
are skipped). A run in which no Session made progress (a model call started, a turn ended) for
STALL_S while some turns were still open is given up as stalled: its wall ends at the last turn
that ended, the Sessions left behind count as never reaching the model (∞), and the next N
still runs.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.support.model_server import (
    ScriptedModelServer,
    stream_event_count,
    text_reply,
    tool_call,
    tool_reply,
)

from ..figures import figure, target
from ..harness import api_key_for, median_of_runs, new_owner, new_session, percentile
from ..models import FINAL_ANSWER, directive_message, next_calls
from ..stack import api_client, running_stack, workers

ANSWER_S = 1.0  # every model answer takes this long, first byte to [DONE] spread over it
TOOL_STEPS = 4  # + the final text answer = 5 model calls per turn
MODEL_CALLS = TOOL_STEPS + 1
# (big tenant's Sessions, small tenant's Sessions) per run
POSTGRES_SHAPES = ((45, 5), (190, 10), (990, 10))
SQLITE_SHAPES = ((45, 5), (90, 10))
QUICK_SHAPES = ((45, 5),)
WORKER_PROCESSES = 2
SAMPLE_S = 0.1
TREE_EVERY_SAMPLES = 10
POLL_S = 0.25
WARM_UP_TIMEOUT_S = 120
STALL_S = 30
# What one backend's runs may take in all (both backends: about 10 minutes). At the targets the
# whole set takes about a minute; today's runtime, far slower, gets the small N and a note.
BUDGET_S = 270
STACK_OVERHEAD_S = 20  # start, warm-up, stop: added to each estimate
EMBEDDED_POST_THREADS = 4

# Targets by (backend, N), from the issue; on PostgreSQL the RSS-per-Session and connection caps
# below hold at every N.
TARGETS = {
    ("postgresql", 200): {
        "wall_s": target("<=", 9, "s"),
        "concurrency": target(">=", 130),
        "first_p95_s": target("<=", 2, "s"),
        "small_first_p95_s": target("<=", 2, "s"),
    },
    ("postgresql", 1000): {"concurrency": target(">=", 400)},
    ("sqlite", 100): {"concurrency": target(">=", 60)},
}
RSS_PER_SESSION_KIB = 1024
CONNECTIONS_PER_WORKER = 2
CONNECTIONS_BESIDES = 10


def slow_reply(request):
    """The zero-latency model's script (bench.models.next_calls), answered in ANSWER_S."""
    calls = next_calls(request.messages)
    if calls:
        reply = tool_reply([tool_call(c["name"], c["arguments"], id=c["id"]) for c in calls])
    else:
        reply = text_reply(FINAL_ANSWER)
    if not request.stream:
        reply.delay_before_s = ANSWER_S
        return reply
    # The usage a provider reports, from the request's size: the server's own estimate encodes
    # every message again, a cost the shared machine would charge to the runtime measured.
    reply.usage = {"prompt_tokens": max(1, len(request.raw_body) // 4), "completion_tokens": 20}
    # The wait before the first event and between events: k equal parts of ANSWER_S.
    include_usage = bool((request.body.get("stream_options") or {}).get("include_usage"))
    events = stream_event_count(reply, include_usage)
    reply.delay_before_s = reply.delay_per_chunk_s = ANSWER_S / events
    return reply


def run(options: dict) -> dict:
    backend = options["backend"]
    embedded = backend == "sqlite"
    shapes = QUICK_SHAPES if options["quick"] else SQLITE_SHAPES if embedded else POSTGRES_SHAPES
    if os.environ.get("BENCH_SLOW_MODEL_SHAPE"):
        # One shape only, e.g. BENCH_SLOW_MODEL_SHAPE=190+10 (to look at one N closely).
        big, small = (int(n) for n in os.environ["BENCH_SLOW_MODEL_SHAPE"].split("+"))
        shapes = ((big, small),)
    with ScriptedModelServer() as server:
        server.default("agent", slow_reply)
        tenants = [tenant_with_model("big", server), tenant_with_model("small", server)]
        runs, skipped = runs_within_budget(
            lambda big, small, deadline: measure(server, tenants, big, small, embedded, deadline),
            shapes,
            options["runs"],
        )
    figures, details = [], {}
    for big, small in shapes:
        count = big + small
        details[f"N={count}"] = runs[count]
        figures += figures_for(backend, count, small, runs[count], options["runs"], skipped.get(count))
    return {"figures": figures, "details": details}


def tenant_with_model(label: str, server) -> dict:
    from sessions_app.models import ModelConfig

    tenant, owner = new_owner(f"slow-{label}")
    config = ModelConfig.objects.create(
        tenant=tenant,
        name="slow scripted",
        base_url=server.base_url,
        model="scripted-model",
        context_window=128000,
        max_output_tokens=1024,
        configured_by_operator=True,  # the operator's own loopback server: not behind the outbound guard
    )
    return {"tenant": tenant, "owner": owner, "config": config, "key": api_key_for(tenant, owner)}


def runs_within_budget(measure_once: Callable, shapes, wanted: int) -> tuple[dict, dict]:
    """Every N once (smallest first), then again up to `wanted` runs each, while estimates fit.

    A first run is estimated from the rate (model calls per second of wall) of the run before it,
    a repeat from 1.5 × its N's first run. A run that hit the budget's end stops everything after
    it (its Sessions may still be queued, and larger N would only hit it sooner); a repeat that
    did is dropped, so the medians are of whole runs (the details keep it).
    """
    began = time.monotonic()
    deadline = began + BUDGET_S
    runs = {big + small: [] for big, small in shapes}
    skipped: dict[int, str] = {}
    took: dict[int, float] = {}  # seconds the first run of each N took, stack start to stop
    rate = None
    for attempt in range(wanted):
        for big, small in shapes:
            count = big + small
            if count in skipped or (attempt and not runs[count]):
                continue
            left = deadline - time.monotonic()
            if count in took:
                needed = 1.5 * took[count]
            else:
                needed = STACK_OVERHEAD_S + (count * MODEL_CALLS / rate if rate else 0)
            if needed > left:
                if not runs[count]:
                    skipped[count] = f"skipped: needs ~{needed:.0f} s, {max(0, left):.0f} s of budget left"
                continue
            started = time.monotonic()
            result = measure_once(big, small, deadline)
            took.setdefault(count, time.monotonic() - started)
            rate = result["calls"] / result["wall_s"] if result["wall_s"] else rate
            if result["stopped"] != "budget":
                runs[count].append(result)
                continue
            if runs[count]:  # a repeat cut short
                runs[count][0]["dropped_repeat"] = result
            else:
                runs[count].append(result)
            for other_big, other_small in shapes:
                if not runs[other_big + other_small]:
                    skipped.setdefault(other_big + other_small, "skipped: the budget ran out")
            return runs, skipped
    return runs, skipped


def figures_for(backend: str, count: int, small: int, runs: list[dict], wanted: int, skip: str | None):
    goals = TARGETS.get((backend, count), {})
    postgres = backend == "postgresql"
    if postgres:
        goals = {
            **goals,
            "rss_per_session_kib": target("<=", RSS_PER_SESSION_KIB, "KiB"),
            "peak_connections": target("<=", CONNECTIONS_PER_WORKER * WORKER_PROCESSES + CONNECTIONS_BESIDES),
        }
    at = f"N={count}"
    unfinished = [r for r in runs if r["stopped"] == "budget"]
    stalled = [r for r in runs if r["stopped"] == "stalled"]
    if skip:
        note = "skipped"
    elif unfinished:
        note = f"run stopped at the budget's end ({unfinished[0]['timeout_s']:.0f} s)"
    else:
        note = "n/a"

    def one(label: str, key: str, unit: str = "") -> dict:
        return figure(f"{at}: {label}", median_of_runs(runs, key), unit, goals.get(key), note=note)

    def wait(label: str, key: str) -> dict:
        """A first-call figure: a Session that never reached the model counts as ∞, not as missing."""
        values = [math.inf if r.get(key) is None else r[key] for r in runs]
        value = statistics.median(values) if values else None
        never = max((r["never_called"] for r in runs), default=0)
        why = f"∞ ({never} Session(s) without a model call)" if runs and not unfinished else note
        return figure(
            f"{at}: {label}",
            None if value is None or math.isinf(value) else value,
            "s",
            goals.get(key),
            note=why,
        )

    if unfinished:  # the figures below then cover what had happened by the budget's end
        skip = f"{len(runs)} of {wanted}, the last stopped after {unfinished[0]['timeout_s']:.0f} s"
    elif stalled:
        skip = f"{len(runs)} of {wanted}, {len(stalled)} stalled (no progress for {STALL_S} s)"
    rows = [
        # Fewer runs than asked when the budget (BUDGET_S) would not hold more.
        figure(
            f"{at}: runs (the medians below)",
            len(runs) if runs and not (unfinished or stalled) else None,
            f"of {wanted}",
            note=skip or "",
        ),
        figure(f"{at}: turns completed", median_of_runs(runs, "completed"), f"of {count}", note="skipped"),
        one("wall time", "wall_s", "s"),
        one("effective concurrency (model-s / wall)", "concurrency"),
        # The server answers in 1 s; what the runtime saw (ModelCall.started_at → ended_at) is longer
        # when the worker is too busy to read the stream as it comes.
        one("model call as the runtime saw it, mean", "call_s_mean", "s"),
        # Between one call's end and the Session's next call: what a step costs in latency here.
        one("between two model calls of a Session, p50", "step_gap_p50_s", "s"),
        one("between two model calls of a Session, p95", "step_gap_p95_s", "s"),
        wait("first model call p50", "first_p50_s"),
        wait("first model call p95", "first_p95_s"),
        wait("first model call max", "first_max_s"),
        wait(f"small tenant ({small}) first model call p50", "small_first_p50_s"),
        wait(f"small tenant ({small}) first model call p95", "small_first_p95_s"),
        wait(f"small tenant ({small}) first model call max", "small_first_max_s"),
        # What one step costs the processes that run slices, in CPU: steadier than the wall figures
        # on a loaded machine, and what bounds them (their cores / this = steps per second).
        one("worker CPU per model call (step)", "worker_cpu_ms_per_call", "ms"),
        # How evenly the processes shared that CPU: 50 % is even between two; more means one
        # process's GIL was the bottleneck while the other had time to spare.
        one("busiest worker process's share of that CPU", "busiest_worker_cpu_pct", "%"),
        # The whole machine (workers, database, Redis, this process and its stand-in model): near
        # 100 % the cores bound the figures above, well below it a wait does.
        one("machine CPU busy", "machine_busy_pct", "%"),
        one("worker RSS, peak", "rss_peak_mib", "MiB"),
        one("worker RSS growth per Session in flight", "rss_per_session_kib", "KiB"),
        # On SQLite too (not measured there), so the rows keep their order beside PostgreSQL's.
        one("PostgreSQL connections, peak", "peak_connections")
        if postgres
        else figure(f"{at}: PostgreSQL connections, peak", None, note="PostgreSQL only"),
    ]
    return rows


# --- one run -----------------------------------------------------------------------------------------


def measure(server, tenants: list[dict], big: int, small: int, embedded: bool, deadline: float) -> dict:
    from django.utils import timezone

    from sessions_app.models import Session

    big_tenant, small_tenant = tenants
    server.reset()
    server.default("agent", slow_reply)
    with stack_for(embedded) as (address, pids), submitter(embedded, address) as submit:
        # Two 1-step turns per process that runs slices: imports, clients, connections.
        warm_up = [
            new_session(big_tenant["tenant"], big_tenant["owner"], f"warm-up {i}", big_tenant["config"])
            for i in range(2 * len(pids))
        ]
        for session in warm_up:
            submit(big_tenant, session, directive_message(1))
        warm_up_deadline = min(deadline, time.monotonic() + WARM_UP_TIMEOUT_S)
        warm_up_sessions = Session.objects.filter(pk__in=[s.pk for s in warm_up])
        if wait_until_ended(warm_up_sessions, len(warm_up), warm_up_deadline) is not None:
            raise TimeoutError(f"the {len(warm_up)} warm-up turns did not end in time")
        idle_kib = idle_rss_kib(pids)

        # The run's Sessions, as the poll names them: the two tenants' ones created from here on.
        created_since = timezone.now()
        run_sessions = Session.objects.filter(
            tenant__in=[big_tenant["tenant"], small_tenant["tenant"]], created_at__gte=created_since
        )
        sessions = [
            (tenant, new_session(tenant["tenant"], tenant["owner"], f"slow {i}", tenant["config"]))
            for tenant, size in ((big_tenant, big), (small_tenant, small))
            for i in range(size)
        ]
        ids = [s.pk for _, s in sessions]
        server.reset()
        server.default("agent", slow_reply)
        began = time.monotonic()
        with Sampler(pids, None if embedded else os.environ["DATABASE_URL"]) as sampler:
            if embedded:  # a few posts at a time, in order: the big tenant's messages go first
                with ThreadPoolExecutor(EMBEDDED_POST_THREADS) as pool:
                    list(pool.map(lambda pair: submit(*pair, directive_message(TOOL_STEPS)), sessions))
            else:  # from this thread: no connection of its own for a helper thread
                for tenant, session in sessions:
                    submit(tenant, session, directive_message(TOOL_STEPS))
            outcome = wait_until_ended(run_sessions, len(ids), deadline)
            stopped = time.time()
    small_ids = {s.pk for tenant, s in sessions if tenant is small_tenant}
    result = figures_of(ids, small_ids, outcome, stopped)
    growth_kib = sampler.peak_rss_kib - idle_kib
    return {
        **result,
        "rss_per_session_kib": growth_kib / result["turns_open_max"] if result["turns_open_max"] else None,
        "timeout_s": deadline - began if outcome == "budget" else None,
        "sessions": len(ids),
        "worker_processes": len(pids),
        "rss_idle_mib": idle_kib / 1024,
        "rss_peak_mib": sampler.peak_rss_kib / 1024,
        "worker_cpu_ms_per_call": 1000 * sampler.cpu_s / result["calls"] if result["calls"] else None,
        "busiest_worker_cpu_pct": 100 * max(sampler.cpu_s_each) / sampler.cpu_s if sampler.cpu_s else None,
        "machine_busy_pct": 100 * sampler.machine_busy if sampler.machine_busy is not None else None,
        "rss_growth_mib": growth_kib / 1024,
        "peak_connections": sampler.peak_connections,
        "server_answer_s": server_answer_times(server),
    }


@contextmanager
def stack_for(embedded: bool):
    """(address, pids of the processes that run slices): runstack in embedded mode, else workers."""
    if embedded:
        with running_stack() as stack:
            yield stack.address, stack.worker_pids
    else:
        with workers(WORKER_PROCESSES) as pids:
            yield None, pids


@contextmanager
def submitter(embedded: bool, address: str | None):
    """How a message is queued: the REST API of runstack (embedded), else `brain.submit_input`."""
    from sessions_app.runtime import brain

    if not embedded:
        yield lambda tenant, session, text: brain.submit_input(session, kind="message", text=text)
        return
    with ExitStack() as stack:
        clients: dict = {}
        lock = threading.Lock()

        def post(tenant, session, text):
            with lock:
                if tenant["key"] not in clients:
                    clients[tenant["key"]] = stack.enter_context(api_client(address, tenant["key"]))
                client = clients[tenant["key"]]
            client.post(f"/sessions/{session.pk}/inputs/", json={"text": text}).raise_for_status()

        yield post


def wait_until_ended(sessions, expected: int, deadline: float) -> str | None:
    """Poll until the turns of `sessions` (a Session queryset of `expected` ones, each with one
    turn) have all ended (None); else "budget" (the deadline came) or "stalled" (no model call
    started and no turn ended for STALL_S).

    Cheap on purpose: this process shares the machine with the runtime it measures. `sessions`
    is a subquery (an IN list of 200 UUIDs cost Django a good part of a core, prepared every
    poll), and model calls are only counted while no turn ends."""
    from sessions_app.models import ModelCall, Turn

    subquery = sessions.values("pk")
    turns_ended = Turn.objects.filter(session__in=subquery, ended_at__isnull=False)
    calls = ModelCall.objects.filter(session__in=subquery)
    progress, moved = None, time.monotonic()
    while time.monotonic() < deadline:
        ended = turns_ended.count()
        if ended >= expected:
            return None
        now = (ended, progress[1] if progress and ended != progress[0] else calls.count())
        if now != progress:
            progress, moved = now, time.monotonic()
        elif time.monotonic() - moved > STALL_S:
            return "stalled"
        time.sleep(POLL_S)
    return "budget"


def figures_of(ids, small_ids: set, outcome: str | None, stopped: float) -> dict:
    """Every figure of one run, from the rows it left as they stood at `stopped` (epoch seconds,
    when the wait ended). `outcome`: None (every turn ended), "budget" or "stalled"."""
    from django.db.models import Min

    from sessions_app.models import Input, ModelCall, Turn

    queued = dict(
        Input.objects.filter(session_id__in=ids).values_list("session_id").annotate(first=Min("created_at"))
    )
    calls = list(
        ModelCall.objects.filter(session_id__in=ids, purpose="agent").values_list(
            "session_id", "started_at", "ended_at"
        )
    )
    turns = list(Turn.objects.filter(session_id__in=ids).values_list("started_at", "ended_at", "reason"))
    # What ended a turn other than its final answer (the first few distinct reasons).
    failures = list(
        Turn.objects.filter(session_id__in=ids, ended_at__isnull=False)
        .exclude(reason="completed")
        .order_by()
        .values_list("reason", "reason_detail")
        .distinct()[:5]
    )
    began = min(queued.values()).timestamp()
    ends = [ended.timestamp() for _, ended, _ in turns if ended is not None and ended.timestamp() <= stopped]
    now = stopped
    # Stopped at the budget's end: the wall is the whole wait; stalled: up to the last turn that ended.
    last = now if outcome == "budget" or not ends else max(ends)
    wall = last - began
    calls = [c for c in calls if c[1].timestamp() <= now]
    done = [c for c in calls if c[2] is not None and c[2].timestamp() <= now]

    first_call = {}
    for session_id, started, _ in calls:
        if session_id not in first_call or started < first_call[session_id]:
            first_call[session_id] = started
    # A Session that never reached the model waited longer than the run: infinite here.
    waits = {
        sid: (first_call[sid] - queued[sid]).total_seconds()
        if sid in first_call and sid in queued
        else math.inf
        for sid in ids
    }
    # As they stood at `now`: a turn that ended later was still open then.
    turns = [(s, e, r) if e and e.timestamp() <= now else (s, None, "") for s, e, r in turns]
    turns = [turn for turn in turns if turn[0].timestamp() <= now]
    in_flight = most_at_once([(s.timestamp(), (e.timestamp() if e else now)) for s, e, _ in turns])
    return {
        "stopped": outcome,
        "completed": sum(1 for *_, reason in turns if reason == "completed"),
        "turn_reasons": dict_count(reason or "open" for *_, reason in turns),
        "turn_failures": [f"{reason}: {detail[:300]}" for reason, detail in failures],
        "never_called": sum(1 for sid in ids if sid not in first_call),
        "calls": len(done),
        "wall_s": wall,
        "concurrency": len(done) * ANSWER_S / wall,
        "model_s_measured": sum((e - s).total_seconds() for _, s, e in done),
        "call_s_mean": statistics.fmean((e - s).total_seconds() for _, s, e in done) if done else None,
        "calls_at_once_max": most_at_once(
            [(s.timestamp(), e.timestamp() if e and e.timestamp() <= now else now) for _, s, e in calls]
        ),
        "turns_open_max": in_flight,
        **step_gap_figures(done),
        **wait_figures("first", list(waits.values())),
        **wait_figures("small_first", [waits[sid] for sid in small_ids]),
    }


def step_gap_figures(done: list[tuple]) -> dict:
    """The runtime's own latency per step under this load: a call's end → the same Session's next
    call's start (the answer read, the tool run, three commits, and any wait for a thread, the GIL
    or a connection in between)."""
    by_session: dict = {}
    for session_id, started, ended in done:
        by_session.setdefault(session_id, []).append((started, ended))
    gaps = []
    for calls in by_session.values():
        calls.sort()
        gaps += [(nxt[0] - prev[1]).total_seconds() for prev, nxt in zip(calls, calls[1:], strict=False)]
    if not gaps:
        return {"step_gap_p50_s": None, "step_gap_p95_s": None}
    return {"step_gap_p50_s": percentile(gaps, 0.50), "step_gap_p95_s": percentile(gaps, 0.95)}


def wait_figures(prefix: str, waits: list[float]) -> dict:
    def finite(value):
        return None if math.isinf(value) else value

    return {
        f"{prefix}_p50_s": finite(percentile(waits, 0.50)),
        f"{prefix}_p95_s": finite(percentile(waits, 0.95)),
        f"{prefix}_max_s": finite(max(waits)),
    }


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals open at one instant."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = current = 0
    for _, step in edges:
        current += step
        most = max(most, current)
    return most


def dict_count(values) -> dict:
    counts: dict = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def server_answer_times(server) -> dict:
    """How long the server took per agent answer (request received → last byte): should be ANSWER_S."""
    took = [r.finished_at - r.received_at for r in server.requests_for("agent") if r.finished_at]
    if not took:
        return {}
    return {"mean_s": statistics.fmean(took), "max_s": max(took), "requests": len(took)}


# --- sampling ----------------------------------------------------------------------------------------


class Sampler:
    """Worker RSS and PostgreSQL connections, every SAMPLE_S on a thread of its own, while the
    block runs; keeps the peaks."""

    def __init__(self, pids: list[int], database_url: str | None):
        self.pids, self.database_url = pids, database_url
        self.peak_rss_kib = 0
        self.cpu_s = 0.0  # user + system CPU of the processes while the block ran
        self.cpu_s_each: list[float] = []  # the same per process (and its children) of `pids`
        self.peak_connections: int | None = None
        self.machine_busy: float | None = None  # share of all cores busy while the block ran
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._connection = None
        if self.database_url:
            import psycopg

            self._connection = psycopg.connect(self.database_url, autocommit=True)
            self.peak_connections = 0
        self._cpu_before_each = [cpu_seconds(process_tree([pid])) for pid in self.pids]
        self._machine_before = machine_ticks()
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.cpu_s_each = [
            cpu_seconds(process_tree([pid])) - before
            for pid, before in zip(self.pids, self._cpu_before_each, strict=True)
        ]
        self.cpu_s = sum(self.cpu_s_each)
        busy, total = (
            after - before for after, before in zip(machine_ticks(), self._machine_before, strict=True)
        )
        self.machine_busy = busy / total if total else None
        self._stop.set()
        self._thread.join()
        if self._connection is not None:
            self._connection.close()

    def _run(self) -> None:
        # The process tree is walked once a second, the known processes' RSS read every sample:
        # walking all of /proc ten times a second cost this process (which shares the machine
        # with the runtime it measures) a tenth of a core.
        tree, samples = self.pids, 0
        while True:
            if samples % TREE_EVERY_SAMPLES == 0:
                tree = process_tree(self.pids)
            samples += 1
            self.peak_rss_kib = max(self.peak_rss_kib, rss_of(tree))
            if self._connection is not None:
                count = self._connection.execute(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchone()[0]
                self.peak_connections = max(self.peak_connections, count)
            if self._stop.wait(SAMPLE_S):
                return


def idle_rss_kib(pids: list[int]) -> float:
    """The median of a few samples a SAMPLE_S apart."""
    samples = []
    for _ in range(5):
        samples.append(rss_kib(pids))
        time.sleep(SAMPLE_S)
    return statistics.median(samples)


def rss_kib(pids: list[int]) -> int:
    """VmRSS of `pids` and all their descendants, summed (KiB)."""
    return rss_of(process_tree(pids))


def process_tree(pids: list[int]) -> list[int]:
    """`pids` and all their descendants (one pass over /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone since the listing
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo, seen = [], list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def machine_ticks() -> tuple[int, int]:
    """(busy, all) CPU ticks of the whole machine so far, from /proc/stat."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU the processes have used so far (their waited-for children included)."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_of(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total
