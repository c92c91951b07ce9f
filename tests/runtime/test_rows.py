"""engine.rows: the step's rows written with SQL composed once store what Model.save() stores."""

import pytest
from django.forms.models import model_to_dict

from sessions_app.models import Message, ModelCall, Turn
from sessions_app.runtime.engine.rows import insert_row, update_row

from .helpers import new_session

pytestmark = pytest.mark.django_db


def test_a_row_inserted_reads_back_as_the_orm_would_have_stored_it(tenant_a, owner_a):
    session = new_session(tenant_a, owner_a)
    turn = Turn.objects.create(tenant=tenant_a, session=session, number=1)
    values = dict(
        tenant_id=tenant_a.pk,
        session_id=session.pk,
        turn_id=turn.pk,
        role="assistant",
        content="héllo",
        tool_calls=[{"id": "c1", "name": "fs_list", "arguments": "{}"}],
    )

    ours = insert_row(Message(**values))
    theirs = Message.objects.create(**values)

    assert ours.pk is not None and not ours._state.adding
    stored, expected = Message.objects.get(pk=ours.pk), Message.objects.get(pk=theirs.pk)
    assert model_to_dict(stored, exclude=["id"]) == model_to_dict(expected, exclude=["id"])
    assert stored.created_at is not None and stored.created_at == ours.created_at
    assert stored.is_error is False and stored.tool_name == ""  # the fields' defaults


def test_an_update_writes_only_the_named_columns_and_counts_the_row(tenant_a, owner_a):
    session = new_session(tenant_a, owner_a)
    call = insert_row(ModelCall(tenant_id=tenant_a.pk, session_id=session.pk, model="m"))

    assert (
        update_row(ModelCall, call.pk, finish_reason="stop", attempt_errors=["a", "b"], prompt_tokens=7) == 1
    )
    assert update_row(ModelCall, 10**12, finish_reason="stop") == 0

    stored = ModelCall.objects.get(pk=call.pk)
    assert (stored.finish_reason, stored.attempt_errors, stored.prompt_tokens, stored.model) == (
        "stop",
        ["a", "b"],
        7,
        "m",
    )
