"""The one way an event is written and announced (STYLE §6).

`emit` appends a SessionEvent with the Session's next gap-free `seq` inside the caller's
transaction (which must hold the Session row lock) and schedules the broadcast for after
commit. The events of one transaction are written together and sent as one message. The channel layer is only a notification bus: a consumer that misses a message
catches up from the log by `seq`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from functools import cache

from channels.layers import get_channel_layer
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone

from ..models import Session, SessionEvent

logger = logging.getLogger(__name__)


def session_group(session_id) -> str:
    return f"session-{str(session_id).replace('-', '')}"


def tenant_sessions_group(tenant_id) -> str:
    """Where `session.status` changes of a tenant's Sessions are announced (`/ws/sessions/`)."""
    return f"tenant-sessions-{tenant_id}"


@dataclass
class SessionRef:
    """What of a Session row writing its events needs: a runner's fenced commit works on this
    instead of the row (it never reads the row on its fast path)."""

    pk: object
    tenant_id: int
    last_event_seq: int


class RowRef:
    """The pk of a row that the statement writing an event also inserts (a runner's one-statement
    commit, engine/rows.py): the event's data names it before it exists, the database fills it in
    (`insert_statement`) and the writer replaces it for the broadcast once the statement ran."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    @property
    def cte(self) -> str:
        """The WITH member that inserts the row and returns its pk."""
        return f"inserted_{self.index}"

    def __repr__(self) -> str:
        return f"RowRef({self.index})"


@dataclass
class NewEvent:
    """An event taking its place in the log (a SessionEvent row once written)."""

    seq: int
    type: str
    data: dict
    created_at: datetime | None = None

    def as_dict(self) -> dict:
        return {"seq": self.seq, "type": self.type, "ts": self.created_at.isoformat(), "data": self.data}


def emit(session: Session | SessionRef, type: str, data: dict) -> NewEvent:
    """Append one event; `session` must be the row locked in the current transaction.

    Inside an event batch (`locked_session`, the runner's fenced commits) the event only takes
    its seq here; the batch writes every event of the transaction with one INSERT and broadcasts
    them with one message after commit. Outside a batch it is written at once.
    """
    session.last_event_seq += 1
    event = NewEvent(seq=session.last_event_seq, type=type, data=data)
    pending = getattr(session, PENDING_EVENTS, None)
    if pending is not None:
        pending.append(event)
        return event
    Session.objects.filter(pk=session.pk).update(last_event_seq=session.last_event_seq)
    _insert(session, [event])
    _broadcast_after_commit(session, [event])
    return event


PENDING_EVENTS = "_pending_events"
PENDING_FIELDS = "_pending_session_fields"


def update_session(session: Session, **fields) -> None:
    """Write columns of the locked Session row. Inside a batch they join the one UPDATE that
    writes `last_event_seq` at the end of the transaction (a turn's start set status, current
    turn and seq in three statements); outside one they are written at once. The row object
    already holds the new values: code in the transaction reads them there, not from the table."""
    pending = getattr(session, PENDING_FIELDS, None)
    if pending is None:
        Session.objects.filter(pk=session.pk).update(**fields)
    else:
        pending.update(fields)


def open_batch(session: Session | SessionRef) -> None:
    """From now on `emit(session, …)` collects events until `flush_batch`."""
    setattr(session, PENDING_EVENTS, [])
    if isinstance(session, Session):
        setattr(session, PENDING_FIELDS, {})


def flush_batch(
    session: Session | SessionRef, *, write_seq: bool = True, written: bool = False
) -> list[NewEvent]:
    """Write the collected events (one INSERT) and, unless the caller's own Session update carries
    it, the new `last_event_seq`; schedule one broadcast for after commit. Closes the batch.
    `written`: the caller's own statement already inserted them (`insert_statement`)."""
    events = getattr(session, PENDING_EVENTS, None) or []
    fields = getattr(session, PENDING_FIELDS, None) or {}
    setattr(session, PENDING_EVENTS, None)
    setattr(session, PENDING_FIELDS, None)
    if events and write_seq:
        fields["last_event_seq"] = session.last_event_seq
    if fields:
        Session.objects.filter(pk=session.pk).update(**fields)
    if not events:
        return []
    if not written:
        _insert(session, events)
    _broadcast_after_commit(session, events)
    return events


def discard_batch(session: Session | SessionRef) -> None:
    setattr(session, PENDING_EVENTS, None)
    setattr(session, PENDING_FIELDS, None)


_COLUMNS = ("tenant", "session", "seq", "type", "data", "created_at")


def _insert(session: Session | SessionRef, events: list[NewEvent]) -> None:
    """One multi-row INSERT. Hand-written (values prepared by SessionEvent's own fields) because
    every step commits three batches and `bulk_create` spent more time in Python than the
    database spent writing them; nothing here needs the rows' ids back."""
    sql, params = insert_statement(session, events)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def insert_statement(
    session: Session | SessionRef, events: list[NewEvent], *, typed: bool = False
) -> tuple[str, list]:
    """The multi-row INSERT of `events` as (sql, params). `typed`: each value cast to its
    column's type, so the rows may come from a SELECT (`... SELECT * FROM (VALUES …) WHERE …`,
    PostgreSQL), not only from a plain VALUES list."""
    conn = connections[DEFAULT_DB_ALIAS]  # not the proxy: one thread-local lookup, not dozens
    now = timezone.now()
    field = SessionEvent._meta.get_field
    tenant, session_id = (
        field("tenant").get_db_prep_save(session.tenant_id, conn),
        field("session").get_db_prep_save(session.pk, conn),
    )
    created_at = field("created_at").get_db_prep_save(now, conn)
    data = field("data")
    params, rows = [], []
    into, row = _insert_parts(conn.vendor, typed)
    for event in events:
        event.created_at = now
        # A pk the same statement inserts (engine.rows.RowRef) is added to the data by the database.
        refs = {key: value for key, value in event.data.items() if isinstance(value, RowRef)} if typed else {}
        static = {key: value for key, value in event.data.items() if key not in refs} if refs else event.data
        params += [tenant, session_id, event.seq, event.type, data.get_db_prep_save(static, conn)]
        if refs:
            params += list(refs)
            added = ", ".join(f"%s::text, (SELECT * FROM {ref.cte})" for ref in refs.values())
            rows.append(row.replace("%s::jsonb", f"(%s::jsonb || jsonb_build_object({added}))", 1))
        else:
            rows.append(row)
        params.append(created_at)
    return f"{into} VALUES {', '.join(rows)}", params


@cache
def _insert_parts(vendor: str, typed: bool) -> tuple[str, str]:
    """The INSERT's head and one row's placeholders (each cast to its column's type if `typed`)."""
    field = SessionEvent._meta.get_field
    quote = connection.ops.quote_name
    into = (
        f"INSERT INTO {quote(SessionEvent._meta.db_table)} "
        f"({', '.join(quote(field(name).column) for name in _COLUMNS)})"
    )
    if typed:
        return into, "(" + ", ".join(f"%s::{field(name).db_type(connection)}" for name in _COLUMNS) + ")"
    return into, "(" + ", ".join(["%s"] * len(_COLUMNS)) + ")"


def _broadcast_after_commit(session: Session | SessionRef, events: list[NewEvent]) -> None:
    payloads = [event.as_dict() for event in events]
    message = (
        {"type": "session.event", "event": payloads[0]}
        if len(payloads) == 1
        else {"type": "session.events", "events": payloads}
    )
    session_id, tenant_id = session.pk, session.tenant_id
    transaction.on_commit(lambda: broadcast(session_id, message))
    for payload in payloads:
        if payload["type"] == "session.status":
            # The list page follows every Session's status without one socket per Session.
            listed = {**payload, "session": str(session_id)}
            transaction.on_commit(
                lambda listed=listed: _group_send(
                    tenant_sessions_group(tenant_id), {"type": "sessions.status", "event": listed}
                )
            )


def broadcast(session_id, message: dict) -> None:
    """Best effort: a lost notification costs latency, never data (clients re-read the log)."""
    _group_send(session_group(session_id), message)


def _group_send(group: str, message: dict) -> None:
    layer = get_channel_layer()
    if layer is not None:
        _broadcaster().send(layer, group, message)


class Broadcaster:
    """Sends to the channel layer from one long-lived thread per process, in order per group.

    A committed operation hands its notification over and goes on: it neither waits for the
    bus nor pays for a new event loop (and, with Redis, a new connection) per message, which
    `async_to_sync` per send did. The thread keeps one event loop for the layer's connections
    and sends what has queued up meanwhile as one batch: a group's consecutive event messages
    become one `session.events` message (its consumers read either), and the groups' sends run
    side by side, at most BROADCAST_CONCURRENCY at once (each holds a Redis connection). Under
    load the queue grows, and so do the batches: the cost per event goes down, not up.
    """

    def __init__(self):
        self.pid = os.getpid()
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="event-broadcaster", daemon=True)
        self.thread.start()

    def send(self, layer, group: str, message: dict) -> None:
        self.queue.put((layer, group, message))

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        while True:
            batch = [self.queue.get()]
            # A busy process announces a few events every millisecond: lingering a moment lets
            # them share one batch (one Redis round trip, one loop run) instead of one each.
            time.sleep(BATCH_LINGER_S)
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            try:
                loop.run_until_complete(_send_batch(batch))
            except Exception:  # the log is the truth; a broken bus must not stop the next send
                logger.warning("broadcast of %d messages failed", len(batch), exc_info=True)


BROADCAST_CONCURRENCY = 8
MAX_BATCH = 1000
BATCH_LINGER_S = 0.005
_EVENT_TYPES = ("session.event", "session.events")


def merged_by_group(batch: list[tuple]) -> dict[tuple, list[dict]]:
    """(layer, group) -> its messages in order, runs of event messages merged into one."""
    by_group: dict[tuple, list[dict]] = {}
    for layer, group, message in batch:
        messages = by_group.setdefault((layer, group), [])
        if messages and message["type"] in _EVENT_TYPES and messages[-1]["type"] in _EVENT_TYPES:
            messages[-1] = {
                "type": "session.events",
                "events": [*_events_of(messages[-1]), *_events_of(message)],
            }
        else:
            messages.append(message)
    return by_group


def _events_of(message: dict) -> list[dict]:
    return message["events"] if message["type"] == "session.events" else [message["event"]]


async def _send_batch(batch: list[tuple]) -> None:
    by_group = merged_by_group(batch)
    by_layer: dict = {}
    for (layer, group), messages in by_group.items():
        by_layer.setdefault(layer, []).append((group, messages))
    many = [layer for layer in by_layer if hasattr(layer, "group_send_many")]
    for layer in many:  # the project's Redis layer: the batch's groups in one round trip
        try:
            await layer.group_send_many(by_layer[layer])
        except Exception:
            logger.warning("broadcast to %d groups failed", len(by_layer[layer]), exc_info=True)
    places = asyncio.Semaphore(BROADCAST_CONCURRENCY)

    async def send_in_order(layer, group: str, messages: list[dict]) -> None:
        async with places:
            for message in messages:
                try:
                    await layer.group_send(group, message)
                except Exception:  # one group's failure costs that group latency, nothing more
                    logger.warning("broadcast to %s failed", group, exc_info=True)

    await asyncio.gather(
        *(
            send_in_order(layer, group, messages)
            for (layer, group), messages in by_group.items()
            if layer not in many
        )
    )


_broadcaster_instance: Broadcaster | None = None
_broadcaster_lock = threading.Lock()


def _broadcaster() -> Broadcaster:
    global _broadcaster_instance
    with _broadcaster_lock:
        # A forked worker process (Celery prefork) has no copy of its parent's thread.
        if _broadcaster_instance is None or _broadcaster_instance.pid != os.getpid():
            _broadcaster_instance = Broadcaster()
        return _broadcaster_instance


def broadcast_delta(session_id, model_call_id: int, text: str) -> None:
    """`model.delta`: live only, never logged, `seq` null (CONTRACT Events)."""
    broadcast(
        session_id,
        {
            "type": "session.delta",
            "event": {
                "seq": None,
                "type": "model.delta",
                "data": {"model_call_id": model_call_id, "text": text},
            },
        },
    )
