"""How SessionEngine writes: every change of a Session's facts is one transaction that holds the
Session row (and, inside a runner slice, proves the slice still holds the lease).

Two shapes:
- `locked_session`: lock the row first, then read and write. For the rare, decision-heavy
  operations (start or end a turn, consume inputs, park on an approval).
- `RunnerWriter.commit`: the step phases of a runner slice. Write first, then one conditional
  update of the Session row that is at once the lease fence, the lease heartbeat, the event
  sequence and, for the commit that opens a step, proof that nothing the slice cached changed
  (no new input, no event from elsewhere, the same configuration). When that proof fails the
  opening commit is rolled back (`StaleSlice`) and the runner re-reads at the step boundary.
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from config.dbconn import hand_back_connections
from tenancy_app.models import Tenant

from ...models import Session
from .. import events
from .rows import DeferredWrites, current_connection, deferring


def lease_duration() -> timedelta:
    return timedelta(seconds=settings.XAGENT_RUNNER_LEASE_SECONDS)


class LeaseLost(Exception):
    """Another runner holds this Session now; the current slice must stop without committing."""


class StaleSlice(Exception):
    """A step's opening commit found the Session changed since the slice read it (an input, an
    event written elsewhere, a configuration change). Nothing was written."""


@contextmanager
def locked_session(session_id, token=None):
    """Open a transaction holding the Session row lock; with `token`, fence on the lease.

    Events emitted on the yielded row are written together when the block ends."""
    with transaction.atomic():
        session = Session.objects.select_for_update().get(pk=session_id)
        if token is not None and session.runner_token != token:
            raise LeaseLost(f"session {session_id}: lease now held by another runner")
        events.open_batch(session)
        try:
            yield session
        except BaseException:
            events.discard_batch(session)
            raise
        events.flush_batch(session)


class RunnerWriter:
    """The fenced commits of one runner slice (see the module docstring)."""

    def __init__(self, session_id, token, tenant_id: int):
        self.session_id, self.token, self.tenant_id = session_id, token, tenant_id
        # What the slice last saw of the Session; None until `observe` (then every commit falls
        # back to locking the row, which is always correct, only slower).
        self.known_seq: int | None = None
        self.config_version: int | None = None
        self.tenant_config_version: int | None = None

    def observe(self, *, last_event_seq: int, config_version: int, tenant_config_version: int) -> None:
        self.known_seq = last_event_seq
        self.config_version = config_version
        self.tenant_config_version = tenant_config_version

    def forget(self) -> None:
        """Something changed behind the slice's back: the next step must re-read first."""
        self.known_seq = None

    @property
    def current(self) -> bool:
        return self.known_seq is not None

    @contextmanager
    def commit(
        self,
        *,
        opens_step: bool = False,
        increments: dict[str, int] | None = None,
        one_statement: bool = False,
    ):
        """One fenced transaction. Yields a Session stand-in to `emit` on; `increments` are
        counters of the Session row the fencing statement itself adds to (e.g. token usage).

        `one_statement`: the block writes rows only through `rows.insert_row`/`update_row` (and
        events); on PostgreSQL they then ride in the fencing statement, which runs on its own,
        without BEGIN and COMMIT: one round trip for the whole commit instead of four or five."""
        stand_in = events.SessionRef(
            pk=self.session_id, tenant_id=self.tenant_id, last_event_seq=self.known_seq or 0
        )
        if one_statement and self.known_seq is not None and connection.vendor == "postgresql":
            yield from self._commit_in_one_statement(stand_in, opens_step, increments or {})
            return
        with transaction.atomic():
            events.open_batch(stand_in)
            try:
                yield stand_in
                written = self._fence(stand_in, opens_step, increments or {})
            except BaseException:
                events.discard_batch(stand_in)
                raise
            events.flush_batch(stand_in, write_seq=False, written=written)

    def _commit_in_one_statement(
        self, stand_in: events.SessionRef, opens_step: bool, increments: dict[str, int]
    ):
        events.open_batch(stand_in)
        try:
            with deferring(current_connection()) as writes:
                yield stand_in
            pending = getattr(stand_in, events.PENDING_EVENTS)
            datas = [event.data for event in pending]
            matched, pks = _compare_and_set(
                self,
                new_seq=self.known_seq + len(pending),
                lease=timezone.now() + lease_duration(),
                opens_step=opens_step,
                increments=increments,
                events_of=(stand_in, pending),
                writes=writes,
            )
            if not matched:
                # Nothing was written: the locked path decides, then the rows go out one by one.
                with transaction.atomic():
                    self._locked_fence(stand_in, opens_step, increments)
                    writes.execute(current_connection(), datas)
                    events.flush_batch(stand_in, write_seq=False)
                return
            self.known_seq += len(pending)
            writes.resolve(current_connection(), pks, datas)
        except BaseException:
            events.discard_batch(stand_in)
            raise
        events.flush_batch(stand_in, write_seq=False, written=True)
        # The commit was its own transaction: the connection goes back to the pool now, not when
        # the thread next waits (its tools, its model). From a tool result's commit to the next
        # request the thread also assembles that request and waits for the GIL beside a hundred
        # other Sessions; a connection held through that was what a busy process waited on
        # (`make bench` slow_model, N = 200, with its 2 connections a process).
        hand_back_connections()

    def _fence(self, stand_in: events.SessionRef, opens_step: bool, increments: dict[str, int]) -> bool:
        """Fence the commit; True when the fencing statement also wrote the pending events."""
        pending = getattr(stand_in, events.PENDING_EVENTS)
        lease = timezone.now() + lease_duration()
        if self.known_seq is not None:
            matched, written = _compare_and_set(
                self,
                new_seq=self.known_seq + len(pending),
                lease=lease,
                opens_step=opens_step,
                increments=increments,
                events_of=(stand_in, pending),
            )
            if matched:
                self.known_seq += len(pending)
                return written
        self._locked_fence(stand_in, opens_step, increments)
        return False

    def _locked_fence(
        self, stand_in: events.SessionRef, opens_step: bool, increments: dict[str, int]
    ) -> None:
        """The slow path: lock the row and look. Only a lost lease or, for an opening commit, a
        change the slice must see (an input waiting, other configuration) stops the commit;
        events written by others only move our sequence numbers."""
        pending = getattr(stand_in, events.PENDING_EVENTS)
        lease = timezone.now() + lease_duration()
        row = (
            Session.objects.select_for_update(of=("self",))
            .select_related("tenant")
            .only(
                "runner_token", "last_event_seq", "wake_requested", "config_version", "tenant__config_version"
            )
            .get(pk=self.session_id)
        )
        if row.runner_token != self.token:
            raise LeaseLost(f"session {self.session_id}: lease now held by another runner")
        if opens_step and (
            row.wake_requested
            or row.config_version != self.config_version
            or row.tenant.config_version != self.tenant_config_version
        ):
            self.forget()
            raise StaleSlice(f"session {self.session_id} changed since the slice read it")
        for offset, event in enumerate(pending, start=1):
            event.seq = row.last_event_seq + offset
        stand_in.last_event_seq = row.last_event_seq + len(pending)
        Session.objects.filter(pk=self.session_id).update(
            last_event_seq=stand_in.last_event_seq,
            lease_expires_at=lease,
            **{column: F(column) + amount for column, amount in increments.items()},
        )
        self.known_seq = stand_in.last_event_seq


def _compare_and_set(
    writer: RunnerWriter,
    *,
    new_seq: int,
    lease,
    opens_step: bool,
    increments: dict,
    events_of: tuple,
    writes: DeferredWrites | None = None,
) -> tuple[bool, bool | list]:
    """The fast path of a fenced commit as one UPDATE of the Session row: (whether it matched,
    whether the same statement wrote the events). It matches our lease, the sequence we know
    and, for an opening commit, no input waiting and the configuration versions we read.
    Hand-written because it runs three times per step and the ORM spends more time composing it
    (the tenant join) than the database runs it. On PostgreSQL the commit's events ride in the
    same statement (the INSERT's rows exist only if the UPDATE matched): one round trip fewer per
    commit; SQLite allows no UPDATE inside a WITH. With `writes` (PostgreSQL only) the commit's
    rows ride in it too and the second value is the pks of the rows it inserted."""
    conn = current_connection()
    field = Session._meta.get_field
    column = conn.ops.quote_name
    assignments = ["last_event_seq = %s", "lease_expires_at = %s"]
    params = [new_seq, field("lease_expires_at").get_db_prep_value(lease, conn)]
    for name, amount in increments.items():
        assignments.append(f"{column(field(name).column)} = {column(field(name).column)} + %s")
        params.append(amount)
    conditions = ["id = %s", "runner_token = %s", "last_event_seq = %s"]
    params += [
        field("id").get_db_prep_value(writer.session_id, conn),
        field("runner_token").get_db_prep_value(writer.token, conn),
        writer.known_seq,
    ]
    if opens_step:
        conditions += [
            "wake_requested = %s",
            "config_version = %s",
            f"tenant_id IN (SELECT id FROM {column(Tenant._meta.db_table)} WHERE id = %s AND config_version = %s)",
        ]
        params += [False, writer.config_version, writer.tenant_id, writer.tenant_config_version]
    sql = f"UPDATE {column(Session._meta.db_table)} SET {', '.join(assignments)} WHERE {' AND '.join(conditions)}"
    session_ref, pending = events_of
    if writes is not None:
        return _write_in_one_statement(sql, params, session_ref, pending, writes)
    if pending and conn.vendor == "postgresql":
        insert, insert_params = events.insert_statement(session_ref, pending, typed=True)
        into, values = insert.split(" VALUES ", 1)
        sql = (
            f"WITH fenced AS ({sql} RETURNING 1) "
            f"{into} SELECT * FROM (VALUES {values}) AS pending WHERE EXISTS (SELECT 1 FROM fenced)"
        )
        with conn.cursor() as cursor:
            cursor.execute(sql, params + insert_params)
            return cursor.rowcount == len(pending), True
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount == 1, False


def _write_in_one_statement(
    fence: str, params: list, session_ref, pending: list, writes: DeferredWrites
) -> tuple[bool, list]:
    """The fence, the commit's rows and its events as one statement, outside any transaction
    block (PostgreSQL runs it as its own transaction). Every write is conditional on the fence's
    row, so a mismatch writes nothing. Data-modifying WITH members run exactly once whether or not
    the final SELECT reads them; it reports whether the fence matched and the new rows' pks."""
    conn = current_connection()
    members, member_params = writes.members(conn, "fenced")
    members.insert(0, f"fenced AS ({fence} RETURNING 1)")
    if pending:
        insert, insert_params = events.insert_statement(session_ref, pending, typed=True)
        into, values = insert.split(" VALUES ", 1)
        members.append(
            f"new_events AS ({into} SELECT * FROM (VALUES {values}) AS pending WHERE EXISTS (SELECT 1 FROM fenced))"
        )
        member_params += insert_params
    sql = f"WITH {', '.join(members)} SELECT (SELECT count(*) FROM fenced){writes.inserted_pks()}"
    with conn.cursor() as cursor:
        cursor.execute(sql, params + member_params)
        matched, *pks = cursor.fetchone()
    return matched == 1, pks
