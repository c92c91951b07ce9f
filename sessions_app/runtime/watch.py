"""One watcher per process for every runner slice in it: interrupts, lease heartbeats, step limits.

A worker process drives hundreds of Sessions at once (ARCHITECTURE §3), most of them waiting on
their model. A watcher thread per slice would mean hundreds of threads each polling the database
four times a second and each holding a connection; this one thread asks for all of them in one
query per poll and extends every lease in one UPDATE per beat, then hands its connection back.

What it does for a watched slice:
- an interrupt queued for its Session fires the slice's `CancelSignal` (within INTERRUPT_POLL_S),
  which closes a model stream at once and stops the calls not yet started;
- its lease is extended well inside the lease, so a slow model or tool never lets it lapse;
  a lease found lost (another runner took over) is no longer extended, and the slice's next
  fenced commit refuses to write;
- a step that has run longer than XAGENT_STEP_TIME_LIMIT is stopped: the signal fires and the
  lease is no longer extended, so it lapses and the recovery sweep hands the Session to a fresh
  runner, which settles the call left open (an `interrupted` result the model can reason about,
  ARCHITECTURE §6). A tool that ignores the signal keeps its thread until it returns, but its
  commits are fenced by the lost lease, and the other Sessions of the process go on stepping.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from functools import reduce
from operator import or_

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from ..choices import InputKind, InputStatus
from ..models import Input, Session
from . import engine
from .llm.base import CancelSignal

logger = logging.getLogger(__name__)

INTERRUPT_POLL_S = 0.25


@dataclass(eq=False)
class Watched:
    """One slice under watch. `stop()` when the slice pauses or ends."""

    session_id: object
    token: object
    cancel: CancelSignal
    beats: bool = True  # extend the lease (a slice that holds one)
    step_started: float = field(default_factory=time.monotonic)
    # Why the watcher fired the signal itself ("" while it has not): a stopped step or a lost lease.
    stopped_because: str = ""
    # False once the slice stopped watching: from then on the watcher never fires its signal (a
    # beat that raced the slice's own release must not read as a lost lease).
    active: bool = True

    def step_started_now(self) -> None:
        self.step_started = time.monotonic()

    def stop(self) -> None:
        _watcher.forget(self)


class _Watcher:
    def __init__(self):
        self._lock = threading.Lock()
        self._watched: dict[int, Watched] = {}
        self._thread: threading.Thread | None = None
        self._last_beat = 0.0

    def watch(self, session_id, token, cancel: CancelSignal, beats: bool) -> Watched:
        entry = Watched(session_id, token, cancel, beats)
        with self._lock:
            self._watched[id(entry)] = entry
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="runner-watch", daemon=True)
                self._thread.start()
        return entry

    def forget(self, entry: Watched) -> None:
        with self._lock:
            entry.active = False
            self._watched.pop(id(entry), None)

    def fire(self, entry: Watched, because: str = "") -> None:
        """Fire a watched slice's signal, unless it stopped watching meanwhile."""
        with self._lock:
            if not entry.active:
                return
            if because:
                entry.stopped_because = because
        entry.cancel.set()

    def watched(self) -> list[Watched]:
        with self._lock:
            return list(self._watched.values())

    def _run(self) -> None:
        from django.db import close_old_connections, connection

        while True:
            time.sleep(INTERRUPT_POLL_S)
            entries = self.watched()
            if not entries:
                continue
            try:
                close_old_connections()
                self.poll(entries)
            except Exception:
                logger.warning("runner watcher: a poll failed", exc_info=True)
            finally:
                # The connection goes back to the pool between polls: the watcher must not hold
                # one of the process's few connections while it sleeps.
                connection.close()

    def poll(self, entries: list[Watched]) -> None:
        live = [e for e in entries if not e.cancel.is_set()]
        if not live:
            return
        interrupted = set(
            Input.objects.filter(
                session_id__in={e.session_id for e in live},
                kind=InputKind.INTERRUPT,
                status=InputStatus.QUEUED,
            ).values_list("session_id", flat=True)
        )
        limit = float(settings.XAGENT_STEP_TIME_LIMIT)
        now = time.monotonic()
        keep_alive = []
        interrupted = {str(session_id) for session_id in interrupted}
        for entry in live:
            if str(entry.session_id) in interrupted:
                self.fire(entry)
            elif now - entry.step_started > limit:
                because = f"the step ran longer than {limit:g} s (XAGENT_STEP_TIME_LIMIT)"
                logger.warning("session %s: %s; stopping it", entry.session_id, because)
                self.fire(entry, because)
            elif entry.beats:
                keep_alive.append(entry)
        # Beat well inside the lease, so a slow model call never lets it lapse.
        beat_every = min(10.0, settings.XAGENT_RUNNER_LEASE_SECONDS / 3)
        if keep_alive and now - self._last_beat >= beat_every:
            self._last_beat = now
            self.heartbeat(keep_alive)

    def heartbeat(self, entries: list[Watched]) -> None:
        held = reduce(or_, (Q(pk=e.session_id, runner_token=e.token) for e in entries))
        extended = Session.objects.filter(held).update(
            lease_expires_at=timezone.now() + engine.lease_duration()
        )
        if extended == len(entries):
            return
        still_held = {
            (str(pk), str(token))
            for pk, token in Session.objects.filter(held).values_list("pk", "runner_token")
        }
        for entry in entries:
            if (str(entry.session_id), str(entry.token)) not in still_held and entry.active:
                # Not beaten again; the slice learns it at its next fenced commit (LeaseLost), which
                # writes nothing. Not cancelled from here: a commit the watcher cannot see yet
                # (another connection's open transaction) must not stop a live step.
                logger.warning("session %s: lease not held while its step ran", entry.session_id)
                entry.beats = False


_watcher = _Watcher()


def watch(session_id, token, cancel: CancelSignal, *, beats: bool = True) -> Watched:
    """Watch a slice until `stop()`: see the module docstring. `beats=False`: never extend its lease."""
    return _watcher.watch(session_id, token, cancel, beats)


def watched_count() -> int:
    return len(_watcher.watched())
