"""The rows every step writes, written with SQL composed once per process.

A step inserts a model-call record and one or two messages and updates the call when it ends.
Through the ORM each of these composes its SQL again (`SQLInsertCompiler`, the update's query
tree): under load that was a tenth of a worker's CPU, more than the database spent running them
(issue #26, py-spy). Here the statement text is built once per model and set of columns, and the
values are still prepared by the model's own fields (`pre_save`, `get_db_prep_save`), so what is
stored is what `Model.save()` would store.

Only for models that no signal listens to (configuration models do: tenancy_app.versioning):
`insert_row` and `update_row` send none.
"""

from __future__ import annotations

from functools import cache

from django.db import connection
from django.db.models import Model


def insert_row(instance: Model) -> Model:
    """INSERT a new `instance` (an auto primary key, no parents); sets its pk. Returns it."""
    model = type(instance)
    fields, sql = _insert_statement(model, connection.vendor)
    params = [field.get_db_prep_save(field.pre_save(instance, True), connection) for field in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        pk = cursor.fetchone()[0] if connection.features.can_return_columns_from_insert else cursor.lastrowid
    instance.pk = pk
    instance._state.adding = False
    instance._state.db = connection.alias
    return instance


def update_row(model: type[Model], pk, **values) -> int:
    """UPDATE the row `pk` of `model` with `values` (field name -> value). Returns rows matched."""
    names = tuple(values)
    fields, sql = _update_statement(model, names, connection.vendor)
    params = [field.get_db_prep_save(values[field.name], connection) for field in fields]
    params.append(model._meta.pk.get_db_prep_value(pk, connection))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


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
