"""Worker presence: which processes run runner slices, and whether a lease holder is gone.

Owns the `WorkerPresence` rows. Each process that runs slices has one holder id,
"host:pid:nonce", which `brain.claim` writes into `Session.runner_holder`; a daemon thread
keeps the process's row fresh every XAGENT_PRESENCE_BEAT_SECONDS. A holder is *gone* when
its row is missing or older than XAGENT_PRESENCE_TIMEOUT_SECONDS, or when it ran on this host
and its pid is dead or now belongs to another process of ours (a restart that reused the pid,
common in containers). The recovery sweep expires the leases of gone holders at once instead
of waiting for them to lapse; the lease token still fences every commit, so a holder declared
gone by mistake can write nothing (it gets LeaseLost) — it only loses its turn to a new runner.

"host" is the hostname plus the pid namespace, so "this host" means "pids here are the same
pids": two containers that share a hostname never judge each other's pids.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import socket
import threading
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from config.dbconn import hand_back_connections

from ..models import WorkerPresence

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict = {"pid": None, "holder": "", "started_at": None, "thread": None, "stop": None}


def local_host() -> str:
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # no procfs (macOS): the hostname alone
        return socket.gethostname()[:120]
    return f"{socket.gethostname()[:120]}/{namespace}"


def holder_id() -> str:
    """This process's holder id; a forked child (prefork pool) gets its own."""
    pid = os.getpid()
    if _state["pid"] != pid:
        with _lock:
            if _state["pid"] != pid:
                _state.update(
                    pid=pid,
                    holder=f"{local_host()}:{pid}:{secrets.token_hex(4)}",
                    started_at=timezone.now(),
                    thread=None,
                    stop=None,
                )
    return _state["holder"]


def parse_holder(holder: str) -> tuple[str, int, str] | None:
    """(host, pid, nonce) of a holder id, or None if it is not one."""
    parts = holder.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), parts[2]


# --- this process's row ----------------------------------------------------------------------------


def beat() -> None:
    """Write (or refresh) this process's presence row."""
    holder = holder_id()
    host, pid, _ = parse_holder(holder)
    now = timezone.now()
    refreshed = WorkerPresence.objects.filter(holder=holder).update(seen_at=now)
    if not refreshed:
        WorkerPresence.objects.update_or_create(
            holder=holder,
            defaults={"seen_at": now},
            create_defaults={"host": host, "pid": pid, "started_at": _state["started_at"], "seen_at": now},
        )


def ensure_started() -> None:
    """Keep this process's presence fresh from now on (idempotent; cheap after the first call).

    Called where a process starts running slices: worker start, embedded start, and lazily by
    the first `brain.drive` of a process. A beat interval of 0 turns the thread off (the tests
    drive slices in-process and write presence rows themselves)."""
    holder = holder_id()
    interval = settings.XAGENT_PRESENCE_BEAT_SECONDS
    if interval <= 0 or _state["thread"] is not None:
        return
    with _lock:
        if _state["thread"] is not None:
            return
        # The first beat is written before this returns, so before this process claims a lease:
        # a holder without a row is gone, and a sweep running meanwhile (this worker's own start
        # sweep, beat's) would expire the lease a new runner just took — a false takeover that
        # re-runs or closes its calls.
        try:
            beat()
        except Exception:
            logger.warning("first presence beat failed; the beat thread retries", exc_info=True)
        # The caller may be a thread that never hands a connection back by itself (a Celery
        # worker's main thread, at `worker_ready`): one of the process's few pooled connections
        # would stay taken for the life of the process.
        hand_back_connections()
        stop = threading.Event()
        thread = threading.Thread(
            target=_beat_forever, args=(stop, interval), name="xagent-presence", daemon=True
        )
        _state.update(thread=thread, stop=stop)
        thread.start()
    atexit.register(stop_presence)
    logger.info("worker presence %s started", holder)


def stop_presence() -> None:
    """Clean shutdown: stop beating and remove the row, so this holder's leases (if any are left)
    are recognised as lost at the next sweep instead of after the timeout."""
    stop, thread = _state.get("stop"), _state.get("thread")
    if stop is None or _state["pid"] != os.getpid():
        return
    stop.set()
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=2)
    _state.update(thread=None, stop=None)
    try:
        WorkerPresence.objects.filter(holder=_state["holder"]).delete()
    except Exception:  # the database may already be gone at exit: the row then just goes stale
        logger.debug("could not remove presence row", exc_info=True)


# Rows of processes gone this long are removed (a gone holder without a row is judged the same way
# as one with a stale row, so this only keeps the table, and the admin list, short).
FORGET_AFTER = timedelta(hours=1)
PRUNE_EVERY_BEATS = 100


def prune() -> int:
    return WorkerPresence.objects.filter(seen_at__lt=timezone.now() - FORGET_AFTER).delete()[0]


def _beat_forever(stop: threading.Event, interval: float) -> None:
    from django.db import close_old_connections, connection

    beats = 0
    try:
        while True:
            try:
                close_old_connections()
                beat()
                beats += 1
                if beats % PRUNE_EVERY_BEATS == 1:
                    prune()
            except Exception:
                # A missed beat is survivable (the timeout is several beats); keep trying.
                logger.warning("presence beat failed", exc_info=True)
            hand_back_connections()
            if stop.wait(interval):
                return
    finally:
        connection.close()


# --- judging holders -------------------------------------------------------------------------------


def timeout() -> timedelta:
    return timedelta(seconds=settings.XAGENT_PRESENCE_TIMEOUT_SECONDS)


def gone_holders(holders) -> set[str]:
    """Which of `holders` are gone (see the module docstring). One query."""
    holders = {h for h in holders if h}
    if not holders:
        return set()
    here = local_host()
    parsed = {h: parse_holder(h) for h in holders}
    local_pids = {p[1] for p in parsed.values() if p is not None and p[0] == here}
    # The holders' rows, and the rows of newer processes here that may have reused their pids.
    wanted = Q(holder__in=holders) | Q(host=here, pid__in=local_pids) if local_pids else Q(holder__in=holders)
    rows = {row.holder: row for row in WorkerPresence.objects.filter(wanted)}
    fresh_after = timezone.now() - timeout()
    mine = holder_id()
    gone = set()
    for holder in holders:
        row, facts = rows.get(holder), parsed[holder]
        if row is None or row.seen_at < fresh_after:
            gone.add(holder)
            continue
        if facts is None or facts[0] != here or holder == mine:
            continue
        _, pid, _ = facts
        if pid == os.getpid() or not _pid_alive(pid):
            gone.add(holder)  # our own pid under another nonce: this process replaced it
            continue
        if any(
            other.pid == pid and other.holder != holder and other.started_at > row.started_at
            for other in rows.values()
        ):
            gone.add(holder)  # the pid now belongs to a newer process of ours
    return gone


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    except OSError:
        return True  # unknown: let the presence timeout decide
    return True
