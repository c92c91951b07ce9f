"""The rows every step writes, written with SQL composed once per process.

A step inserts a model-call record and one or two messages and updates the call when it ends.
Through the ORM each of these composes its SQL again (`SQLInsertCompiler`, the update's query
tree): under load that was a tenth of a worker's CPU, more than the database spent running them
(issue #26, py-spy). Here the statement text is built once per model and set of columns, and the
values are still prepared by the model's own fields (`pre_save`, `get_db_prep_save`), so what is
stored is what `Model.save()` would store.

Only for models that no signal listens to (configuration models do: tenancy_app.versioning):
`insert_row` and `update_row` send none.

Inside `deferring()` (a runner's one-statement commit on PostgreSQL, engine/fencing.py) they
execute nothing: the writes are collected and go out as members of the fencing statement's WITH,
each conditional on the fence; an inserted row's pk is a `RowRef` until that statement ran.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from functools import cache

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Model

from ..events import RowRef


def current_connection():
    """This thread's connection itself: `django.db.connection` is a proxy that looks the thread's
    connection up again (an asgiref Local) at every attribute, dozens of times per commit."""
    return connections[DEFAULT_DB_ALIAS]


def insert_row(instance: Model) -> Model:
    """INSERT a new `instance` (an auto primary key, no parents); sets its pk. Returns it."""
    conn = current_connection()
    model = type(instance)
    fields, sql = _insert_statement(model, conn.vendor)
    params = [field.get_db_prep_save(field.pre_save(instance, True), conn) for field in fields]
    writes = getattr(_deferred, "writes", None)
    if writes is not None:
        instance.pk = RowRef(len(writes.inserts))
        writes.inserts.append((instance, sql, params))
        return instance
    _execute_insert(conn, instance, sql, params)
    return instance


def _execute_insert(conn, instance: Model, sql: str, params: list) -> None:
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        pk = cursor.fetchone()[0] if conn.features.can_return_columns_from_insert else cursor.lastrowid
    _inserted(conn, instance, pk)


def _inserted(conn, instance: Model, pk) -> None:
    instance.pk = pk
    instance._state.adding = False
    instance._state.db = conn.alias


def update_row(model: type[Model], pk, **values) -> int | None:
    """UPDATE the row `pk` of `model` with `values` (field name -> value). Returns rows matched
    (None when deferred: the commit's statement has not run yet)."""
    conn = current_connection()
    names = tuple(values)
    fields, sql = _update_statement(model, names, conn.vendor)
    params = [field.get_db_prep_save(values[field.name], conn) for field in fields]
    params.append(model._meta.pk.get_db_prep_value(pk, conn))
    writes = getattr(_deferred, "writes", None)
    if writes is not None:
        writes.updates.append((model, names, params, sql))
        return None
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


class DeferredWrites:
    """The row writes of one commit, collected by `deferring()` instead of executed."""

    def __init__(self):
        self.inserts: list[tuple[Model, str, list]] = []  # (instance, its own INSERT, params)
        self.updates: list[tuple[type[Model], tuple, list, str]] = []  # (model, names, params, its UPDATE)

    def members(self, conn, fence: str) -> tuple[list[str], list]:
        """WITH members writing the rows only if the CTE `fence` returned a row, and their params."""
        members, params = [], []
        for index, (instance, _, values) in enumerate(self.inserts):
            members.append(
                _conditional_insert(type(instance), conn.vendor).format(cte=RowRef(index).cte, fence=fence)
            )
            params += values
        for index, (model, names, values, _) in enumerate(self.updates):
            members.append(
                _conditional_update(model, names, conn.vendor).format(cte=f"updated_{index}", fence=fence)
            )
            params += values
        return members, params

    def inserted_pks(self) -> str:
        """Select-list items giving the inserted rows' pks, in order."""
        return "".join(f", (SELECT * FROM {RowRef(index).cte})" for index in range(len(self.inserts)))

    def resolve(self, conn, pks, datas=()) -> None:
        """The statement ran: give the instances their pks and replace the RowRefs in `datas`."""
        for (instance, _, _), pk in zip(self.inserts, pks, strict=True):
            _inserted(conn, instance, pk)
        for data in datas:
            for key, value in data.items():
                if isinstance(value, RowRef):
                    data[key] = self.inserts[value.index][0].pk

    def execute(self, conn, datas=()) -> None:
        """Run the writes as statements of their own (the commit's locked path), then `resolve`."""
        for instance, sql, params in self.inserts:
            _execute_insert(conn, instance, sql, params)
        for _, _, params, sql in self.updates:
            with conn.cursor() as cursor:
                cursor.execute(sql, params)
        self.resolve(conn, [instance.pk for instance, _, _ in self.inserts], datas)


_deferred = threading.local()


@contextmanager
def deferring(conn):
    """Collect this thread's `insert_row`/`update_row` calls instead of running them; any other
    statement in the block is a bug (it would commit on its own) and raises."""
    writes = DeferredWrites()
    _deferred.writes = writes
    try:
        with conn.execute_wrapper(_refuse_statement):
            yield writes
    finally:
        _deferred.writes = None


def _refuse_statement(execute, sql, params, many, context):
    raise RuntimeError(f"a one-statement commit ran a statement of its own: {sql[:200]}")


# `vendor` is part of the cache key: the quoting and RETURNING depend on the database.
@cache
def _insert_statement(model: type[Model], vendor: str) -> tuple[list, str]:
    meta = model._meta
    assert not meta.parents, f"{meta.label}: inherited models are saved by the ORM"
    fields = [f for f in meta.local_concrete_fields if f is not meta.auto_field]
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))})"
    )
    if connection.features.can_return_columns_from_insert:
        sql += f" RETURNING {quote(meta.pk.column)}"
    return fields, sql


@cache
def _update_statement(model: type[Model], names: tuple[str, ...], vendor: str) -> tuple[list, str]:
    meta = model._meta
    fields = [meta.get_field(name) for name in names]
    quote = connection.ops.quote_name
    assignments = ", ".join(f"{quote(f.column)} = %s" for f in fields)
    return fields, f"UPDATE {quote(meta.db_table)} SET {assignments} WHERE {quote(meta.pk.column)} = %s"


# The WITH members of a one-statement commit ({cte} and {fence} filled in per commit). Each value
# is cast to its column's type: in an INSERT … SELECT an untyped literal would be text.
@cache
def _conditional_insert(model: type[Model], vendor: str) -> str:
    meta = model._meta
    fields, _ = _insert_statement(model, vendor)
    quote = connection.ops.quote_name
    typed = ", ".join(f"%s::{field.db_type(connection)}" for field in fields)
    return (
        f"{{cte}} AS (INSERT INTO {quote(meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "
        f"SELECT {typed} WHERE EXISTS (SELECT 1 FROM {{fence}}) RETURNING {quote(meta.pk.column)})"
    )


@cache
def _conditional_update(model: type[Model], names: tuple[str, ...], vendor: str) -> str:
    meta = model._meta
    fields, _ = _update_statement(model, names, vendor)
    quote = connection.ops.quote_name
    assignments = ", ".join(f"{quote(f.column)} = %s::{f.db_type(connection)}" for f in fields)
    return (
        f"{{cte}} AS (UPDATE {quote(meta.db_table)} SET {assignments} "
        f"WHERE {quote(meta.pk.column)} = %s AND EXISTS (SELECT 1 FROM {{fence}}))"
    )
