"""Helpers the scenarios share inside a child process: people, Sessions, an in-process turn,
the database's footprint, and the summary statistics every figure is made of.

Turns are driven only through the runtime's public entry points (`engine.create_session`,
`brain.submit_input`, `brain.drive`), so the benchmark keeps working while the runtime's
inside is rebuilt.
"""

from __future__ import annotations

import math
import resource
import statistics
import uuid
from pathlib import Path

from .probe import CALL_LOG

MAX_SLICES_PER_STEP = 4  # a turn that needs more slices than this per step is stuck, not slow


# --- statistics ------------------------------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (no interpolation: a figure is always a value that was seen)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def median_of_runs(runs: list[dict], key: str) -> float | None:
    values = [run[key] for run in runs if run.get(key) is not None]
    return statistics.median(values) if values else None


def window_mean(values: list[float], fraction: float, *, last: bool) -> float:
    """Mean of the first (or last) `fraction` of `values`, at least one value."""
    size = max(1, round(len(values) * fraction))
    return statistics.fmean(values[-size:] if last else values[:size])


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


# --- people and Sessions ---------------------------------------------------------------------------


def new_owner(label: str):
    """A fresh tenant and its owner (unique names: scenarios share one database per child)."""
    from tenancy_app.actions import do_create_tenant, do_create_user
    from tenancy_app.choices import Role

    slug = f"bench-{label}-{uuid.uuid4().hex[:6]}"
    tenant, _ = do_create_tenant(slug, f"Bench {label}")
    owner, _ = do_create_user(f"{slug}-owner", tenant, Role.OWNER)
    return tenant, owner


def api_key_for(tenant, owner) -> str:
    from tenancy_app.actions import do_issue_api_key

    return do_issue_api_key(tenant, owner, "bench")[1]


def new_session(tenant, owner, title: str, model_config=None):
    from sessions_app.runtime import engine

    return engine.create_session(tenant=tenant, owner=owner, title=title, model_config=model_config)


def add_default_tools(tenant, tool_names: list[str]) -> None:
    """Give every new Session of the tenant these tools (a default tool set, as an admin would)."""
    from tools_app.models import Tool, ToolSet

    toolset = ToolSet.objects.create(tenant=tenant, name=f"bench-{uuid.uuid4().hex[:6]}", is_default=True)
    toolset.tools.add(*Tool.objects.for_tenant(tenant).filter(name__in=tool_names))


# --- one turn, in this process ---------------------------------------------------------------------


class TurnFailed(RuntimeError):
    pass


def run_turn_in_process(session, message: str, expected_steps: int):
    """Queue `message` and drive the Session here, slice after slice, until its turn has ended.

    `brain.drive` re-enqueues a runner after a yielding slice. No worker consumes it here: in
    embedded mode the broker is this process's memory and no in-process worker was started; in
    production mode no worker runs during this child (bench.backends empties Redis between
    children). So this loop stays the only runner.
    Returns the finished Turn.
    """
    from sessions_app.models import Turn
    from sessions_app.runtime import brain

    CALL_LOG.clear()
    brain.submit_input(session, kind="message", text=message)
    for _ in range(MAX_SLICES_PER_STEP * (expected_steps + 2)):
        outcome = brain.drive(session.pk)
        if outcome != "yielded":
            break
    turn = Turn.objects.filter(session=session).order_by("-pk").first()
    if turn is None or turn.ended_at is None or turn.reason != "completed":
        state = "no turn" if turn is None else f"reason={turn.reason or 'open'} {turn.reason_detail}"
        raise TurnFailed(f"the turn did not complete ({state}; last slice: {outcome})")
    return turn


def step_intervals() -> tuple[list[float], list[int]]:
    """Milliseconds and queries between consecutive model calls of the last turn."""
    entries = CALL_LOG.entries
    millis = [(b[0] - a[0]) * 1000 for a, b in zip(entries, entries[1:], strict=False)]
    queries = [b[1] - a[1] for a, b in zip(entries, entries[1:], strict=False)]
    return millis, queries


# --- storage ---------------------------------------------------------------------------------------


def stored_bytes() -> int:
    """What the app's data occupies now: SQLite file + WAL, or PostgreSQL's relation sizes."""
    from django.db import connection

    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            # Fold the WAL into the file first: WAL frames repeat pages, the file is what is kept.
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        name = Path(connection.settings_dict["NAME"])
        return sum(p.stat().st_size for p in (name, Path(f"{name}-wal")) if p.exists())
    tables = connection.introspection.table_names()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(SUM(pg_total_relation_size(quote_ident(t))), 0) FROM unnest(%s::text[]) t",
            [tables],
        )
        return int(cursor.fetchone()[0])
