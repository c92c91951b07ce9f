"""The real stack, started from a child process on its database: daphne (`manage.py runstack`)
and, in production mode, Celery worker processes (`celery -A config worker`, as the README's
production section runs them). In embedded mode runstack's in-process worker does the work.

Plus the two clients the scenarios use: the REST API (httpx2) and a Session's WebSocket.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx2 as httpx
from websockets.sync.client import connect

from tests.integration.processes import free_port, running, wait_for_http


def worker_command(concurrency: int | None = None, name: str = "") -> list[str]:
    """`celery -A config worker` named `<name>@<host>` (default name: bench-<this pid>).

    Without `concurrency` the worker runs the pool and concurrency the settings choose
    (CELERY_WORKER_POOL, CELERY_WORKER_CONCURRENCY), as production runs it.
    """
    command = [sys.executable, "-m", "celery", "-A", "config", "worker"]
    if concurrency is not None:
        command += ["--concurrency", str(concurrency)]
    return command + [
        "--loglevel",
        "WARNING",
        "--without-mingle",
        "--without-gossip",
        "--hostname",
        f"{name or f'bench-{os.getpid()}'}@%h",
    ]


@dataclass(frozen=True)
class Stack:
    """A running stack: where daphne answers, and the processes that run the Sessions' slices
    (the Celery workers in production mode; daphne itself, with its in-process worker, in
    embedded mode)."""

    address: str
    worker_pids: list[int]


@contextmanager
def live_stack(worker_processes: int = 2) -> Iterator[str]:
    """Serve the product until the block ends; yields "127.0.0.1:<port>" once /healthz answers."""
    with running_stack(worker_processes) as stack:
        yield stack.address


@contextmanager
def running_stack(worker_processes: int = 2) -> Iterator[Stack]:
    """`live_stack`, yielding the Stack (address and worker pids)."""
    from django.conf import settings

    port = free_port()
    log = _log_dir() / "web.log"
    with ExitStack() as stack:
        command = [sys.executable, "manage.py", "runstack", "--port", str(port)]
        web = stack.enter_context(running(command, dict(os.environ), log))
        pids = [web.pid] if settings.EMBEDDED else stack.enter_context(workers(worker_processes))
        wait_for_http(f"http://127.0.0.1:{port}/healthz", web, log)
        yield Stack(f"127.0.0.1:{port}", pids)


@contextmanager
def workers(processes: int) -> Iterator[list[int]]:
    """`processes` separate `celery -A config worker` processes until the block ends, each with
    the pool and concurrency the settings choose; yields their pids once every one of them
    answers. Production mode only."""
    log_dir = _log_dir()
    with ExitStack() as stack:
        names = [f"bench{index}-{os.getpid()}-{uuid.uuid4().hex[:6]}" for index in range(processes)]
        pids = [
            stack.enter_context(
                running(worker_command(name=name), dict(os.environ), log_dir / f"worker-{index}.log")
            ).pid
            for index, name in enumerate(names)
        ]
        wait_for_workers(names)
        wait_for_worker()
        yield pids


def _log_dir() -> Path:
    """Where the processes' output goes: the directory the parent gave this child (bench.backends)."""
    return Path(tempfile.mkdtemp(prefix="stack-", dir=os.environ.get("BENCH_LOG_DIR")))


def wait_for_worker(timeout_s: float = 60) -> None:
    """Block until a Celery worker answers `config.ping` through the broker (and the shared cache)."""
    from django.core.cache import cache

    from config.celery import PING_CACHE_PREFIX, ping

    nonce = uuid.uuid4().hex
    ping.delay(nonce)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cache.get(PING_CACHE_PREFIX + nonce) == "pong":
            return
        time.sleep(0.1)
    raise RuntimeError(f"no Celery worker answered within {timeout_s:.0f} s")


def wait_for_workers(names: list[str], timeout_s: float = 60) -> None:
    """Block until every worker named (`<name>@host`) answers a remote-control ping."""
    from config.celery import app

    missing = set(names)
    deadline = time.monotonic() + timeout_s
    while missing and time.monotonic() < deadline:
        for reply in app.control.ping(timeout=0.5):
            missing.difference_update(hostname.split("@")[0] for hostname in reply)
    if missing:
        raise RuntimeError(
            f"{len(missing)} of {len(names)} Celery workers did not answer within {timeout_s:.0f} s"
        )


def api_client(address: str, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=f"http://{address}/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=60
    )


class StreamStalled(RuntimeError):
    """No frame for a long time: says whether the runtime or the delivery stalled."""


class SessionStream:
    """A client of `/ws/sessions/{id}/` that remembers the last logged `seq` it received."""

    def __init__(self, socket, session_id):
        self.socket, self.session_id, self.last_seq = socket, session_id, 0

    def receive(self, timeout_s: float = 60) -> tuple[dict, float]:
        """The next frame and the wall-clock time it arrived."""
        try:
            frame = json.loads(self.socket.recv(timeout=timeout_s))
        except TimeoutError:
            raise StreamStalled(self.stall_report(timeout_s)) from None
        self.last_seq = frame.get("seq") or self.last_seq
        return frame, time.time()

    def wait_for(self, matches) -> tuple[dict, float]:
        """The first frame that `matches`, and when it arrived."""
        while True:
            frame, arrived = self.receive()
            if matches(frame):
                return frame, arrived

    def stall_report(self, timeout_s: float) -> str:
        from sessions_app.models import Input, Session, SessionEvent

        session = Session.objects.get(pk=self.session_id)
        logged = list(
            SessionEvent.objects.filter(session_id=self.session_id, seq__gt=self.last_seq).values_list(
                "seq", "type"
            )
        )
        queued = Input.objects.filter(session_id=self.session_id, status="queued").count()
        where = "the socket did not deliver logged events" if logged else "the runtime logged nothing new"
        return (
            f"no frame for {timeout_s:.0f} s: {where} (received up to seq {self.last_seq}, "
            f"logged after it: {logged[:5]}; status {session.status}, {queued} input(s) queued, "
            f"runner lease {'held' if session.runner_token else 'free'})"
        )


@contextmanager
def session_stream(address: str, key: str, session_id) -> Iterator[SessionStream]:
    with connect(f"ws://{address}/ws/sessions/{session_id}/?token={key}", max_size=None) as socket:
        yield SessionStream(socket, session_id)


def event_time(frame: dict) -> float | None:
    """When the event's row was written (its `ts`), as epoch seconds; None for live-only frames."""
    stamp = frame.get("ts")
    return datetime.fromisoformat(stamp).timestamp() if stamp else None
