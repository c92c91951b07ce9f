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

from tenancy_app.models import Tenant

from ...models import Session
from .. import events


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
    def commit(self, *, opens_step: bool = False, increments: dict[str, int] | None = None):
        """One fenced transaction. Yields a Session stand-in to `emit` on; `increments` are
        counters of the Session row the fencing statement itself adds to (e.g. token usage)."""
        stand_in = events.SessionRef(
            pk=self.session_id, tenant_id=self.tenant_id, last_event_seq=self.known_seq or 0
        )
        with transaction.atomic():
            events.open_batch(stand_in)
            try:
                yield stand_in
                written = self._fence(stand_in, opens_step, increments or {})
            except BaseException:
                events.discard_batch(stand_in)
                raise
            events.flush_batch(stand_in, write_seq=False, written=written)

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
        # Slow path: lock the row and look. Only a lost lease or, for an opening commit, a change
        # the slice must see (an input waiting, other configuration) stops the commit; events
        # written by others only move our sequence numbers.
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
        return False


def _compare_and_set(
    writer: RunnerWriter, *, new_seq: int, lease, opens_step: bool, increments: dict, events_of: tuple
) -> tuple[bool, bool]:
    """The fast path of a fenced commit as one UPDATE of the Session row: (whether it matched,
    whether the same statement wrote the events). It matches our lease, the sequence we know
    and, for an opening commit, no input waiting and the configuration versions we read.
    Hand-written because it runs three times per step and the ORM spends more time composing it
    (the tenant join) than the database runs it. On PostgreSQL the commit's events ride in the
    same statement (the INSERT's rows exist only if the UPDATE matched): one round trip fewer per
    commit; SQLite allows no UPDATE inside a WITH."""
    field = Session._meta.get_field
    column = connection.ops.quote_name
    assignments = ["last_event_seq = %s", "lease_expires_at = %s"]
    params = [new_seq, field("lease_expires_at").get_db_prep_value(lease, connection)]
    for name, amount in increments.items():
        assignments.append(f"{column(field(name).column)} = {column(field(name).column)} + %s")
        params.append(amount)
    conditions = ["id = %s", "runner_token = %s", "last_event_seq = %s"]
    params += [
        field("id").get_db_prep_value(writer.session_id, connection),
        field("runner_token").get_db_prep_value(writer.token, connection),
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
    if pending and connection.vendor == "postgresql":
        insert, insert_params = events.insert_statement(session_ref, pending, typed=True)
        into, values = insert.split(" VALUES ", 1)
        sql = (
            f"WITH fenced AS ({sql} RETURNING 1) "
            f"{into} SELECT * FROM (VALUES {values}) AS pending WHERE EXISTS (SELECT 1 FROM fenced)"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params + insert_params)
            return cursor.rowcount == len(pending), True
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount == 1, False
