"""Seams of one step (issue #10, first part): the lease fences the step count, and one OpenAI
client per endpoint and key is reused across steps."""

import uuid

import pytest

from sessions_app.models import Session, Turn
from sessions_app.runtime import brain, engine
from sessions_app.runtime.llm.config import OPENAI_PROVIDER, EffectiveModel
from sessions_app.runtime.llm.openai_provider import OpenAIChatProvider, client_for

from .helpers import new_session


def model(**changes) -> EffectiveModel:
    base = dict(
        provider=OPENAI_PROVIDER,
        name="m",
        model="x",
        base_url="http://127.0.0.1:9/v1",
        api_key="k1",
        context_window=1000,
        max_output_tokens=100,
    )
    return EffectiveModel(**{**base, **changes})


def test_a_model_configuration_reuses_one_client():
    assert OpenAIChatProvider(model()).client is OpenAIChatProvider(model(temperature=0.3)).client
    assert client_for(model(api_key="k2")) is not client_for(model())
    assert client_for(model(guarded=True)) is not client_for(model())


@pytest.mark.django_db
def test_a_step_count_from_a_lost_lease_is_refused(tenant_a, owner_a):
    session = new_session(tenant_a, owner_a)
    token = brain.acquire(session.pk)
    turn = Turn.objects.create(tenant=tenant_a, session=session, number=1)

    engine.record_step(session.pk, token, turn.pk, {"idle_rounds": 1})
    Session.objects.filter(pk=session.pk).update(runner_token=uuid.uuid4())  # another runner took over
    with pytest.raises(engine.LeaseLost):
        engine.record_step(session.pk, token, turn.pk, {"idle_rounds": 2})

    turn.refresh_from_db()
    assert turn.steps == 1 and turn.guard_state == {"idle_rounds": 1}
