"""Usage and cost (issue #28): every model call's provider-reported usage is recorded and priced
when it is recorded; `/api/v1/usage/` sums it per user, model, Session and day, tenant-scoped
(members see their own). Turns run for real against the scripted model server through the
openai client; only the LLM is a stand-in."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.utils import timezone

from sessions_app.models import ModelCall
from tests.support.model_server import text_reply
from tests.tenancy.isolation import assert_error_shape, assert_requires_auth

from .helpers import drive_until_idle, new_session, send

pytestmark = pytest.mark.django_db(transaction=True)

USAGE = "/api/v1/usage/"


def price(config, input, output, cached=None):
    config.input_price, config.output_price = Decimal(input), Decimal(output)
    config.cached_input_price = Decimal(cached) if cached is not None else None
    config.save()


def answer(session, model_server, prompt, completion, cached=0):
    """One turn whose single model call reports this usage."""
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    model_server.script("agent", text_reply("done", usage=usage))
    send(session, "go")
    drive_until_idle(session)
    assert session.status == "idle", session.status_reason


def rows(client, **params):
    response = client.get(USAGE, params)
    assert response.status_code == 200, response.content
    return {row["key"]: row for row in response.json()["results"]}


def test_totals_are_the_reported_usage_summed_and_priced_when_recorded(
    api_owner_a, tenant_a, owner_a, member_a, model_config_a, model_server
):
    price(model_config_a, "2.50", "10", cached="1.25")
    mine, theirs = (
        new_session(tenant_a, owner_a, title="mine"),
        new_session(tenant_a, member_a, title="theirs"),
    )
    answer(mine, model_server, prompt=1000, completion=200, cached=400)
    answer(mine, model_server, prompt=3000, completion=100)
    answer(theirs, model_server, prompt=500, completion=50)

    by_user = rows(api_owner_a, group_by="user")
    # (600 × 2.50 + 400 × 1.25 + 200 × 10) + (3000 × 2.50 + 100 × 10) = 12,500 per million tokens.
    assert by_user["owner_a"] == {
        "key": "owner_a",
        "prompt_tokens": 4000,
        "cached_prompt_tokens": 400,
        "completion_tokens": 300,
        "cost": pytest.approx(0.0125),
        "calls": 2,
    }
    assert by_user["member_a"]["prompt_tokens"] == 500 and by_user["member_a"]["cost"] == pytest.approx(
        0.00175
    )
    by_session = rows(api_owner_a, group_by="session")
    assert (
        by_session[str(mine.pk)]["title"] == "mine" and by_session[str(mine.pk)]["completion_tokens"] == 300
    )
    assert rows(api_owner_a, group_by="model")["scripted-model"]["calls"] == 3
    today = timezone.now().date().isoformat()
    assert rows(api_owner_a, group_by="day")[today]["prompt_tokens"] == 4500
    # The Session's own counters and the calls' rows agree with the totals.
    mine.refresh_from_db()
    assert (mine.prompt_tokens, mine.completion_tokens) == (4000, 300)
    assert ModelCall.objects.get(session=mine, prompt_tokens=1000).params["prices"] == {
        "input": "2.500000",
        "output": "10.000000",
        "cached_input": "1.250000",
    }


def test_a_price_change_applies_from_the_next_call_on(
    api_owner_a, tenant_a, owner_a, model_config_a, model_server
):
    session = new_session(tenant_a, owner_a)
    answer(session, model_server, prompt=1000, completion=0)  # not priced yet: counted, cost 0
    price(model_config_a, "1", "1")
    answer(session, model_server, prompt=1000, completion=0)
    price(model_config_a, "3", "1")
    answer(session, model_server, prompt=1000, completion=0)

    costs = list(ModelCall.objects.filter(session=session).order_by("id").values_list("cost", flat=True))
    assert costs == [None, Decimal("0.001"), Decimal("0.003")]
    assert rows(api_owner_a, group_by="user")["owner_a"]["cost"] == pytest.approx(0.004)


def test_members_see_their_own_usage_admins_everyones(
    api_owner_a, api_member_a, tenant_a, owner_a, member_a, model_config_a, model_server
):
    answer(new_session(tenant_a, owner_a), model_server, prompt=10, completion=1)
    answer(new_session(tenant_a, member_a), model_server, prompt=20, completion=2)

    assert set(rows(api_member_a, group_by="user")) == {"member_a"}
    assert_error_shape(api_member_a.get(USAGE, {"user": "owner_a"}), 400, "validation_error")
    assert set(rows(api_owner_a, group_by="user")) == {"owner_a", "member_a"}
    assert set(rows(api_owner_a, group_by="user", user="member_a")) == {"member_a"}


def test_usage_is_tenant_scoped(
    api_owner_a, api_outsider_b, tenant_a, owner_a, model_config_a, model_server, api_anonymous
):
    session = new_session(tenant_a, owner_a)
    answer(session, model_server, prompt=10, completion=1)

    assert rows(api_owner_a, group_by="session")
    assert rows(api_outsider_b, group_by="session") == {}
    assert rows(api_outsider_b, group_by="day") == {}
    # Another tenant's member is not a member here.
    assert_error_shape(api_outsider_b.get(USAGE, {"user": "owner_a"}), 400, "validation_error")
    assert_requires_auth(api_anonymous, USAGE)


@pytest.mark.parametrize(
    "params, name",
    [
        ({"group_by": "tenant"}, "group_by"),
        ({"from": "yesterday"}, "from"),
        ({"to": "2026-13-45"}, "to"),
        ({"from": "2026-12-02", "to": "2026-12-01"}, "from"),
    ],
)
def test_bad_parameters_are_a_clear_400(api_owner_a, params, name):
    body = assert_error_shape(api_owner_a.get(USAGE, params), 400, "validation_error")
    assert name in body["details"]


def test_a_period_selects_the_calls_started_within_it(
    api_owner_a, tenant_a, owner_a, model_config_a, model_server
):
    answer(new_session(tenant_a, owner_a), model_server, prompt=10, completion=1)
    today = timezone.now().date()
    assert rows(api_owner_a, group_by="day", **{"from": today.isoformat(), "to": today.isoformat()})
    earlier = (today.replace(year=today.year - 1)).isoformat()
    assert rows(api_owner_a, group_by="day", **{"from": earlier, "to": earlier}) == {}


def test_admin_lists_the_calls_with_their_usage_totals(
    owner_a, tenant_a, model_config_a, model_server, outsider_b
):
    from django.test import Client

    from sessions_app.runtime import engine

    price(model_config_a, "2", "8")
    answer(new_session(tenant_a, owner_a, title="listed"), model_server, prompt=1000, completion=100)
    engine.create_session(tenant=outsider_b.memberships.get().tenant, owner=outsider_b, title="theirs")
    admin = Client()
    admin.force_login(owner_a)
    response = admin.get("/admin/sessions_app/modelcall/")
    assert response.status_code == 200
    by_model, by_user = response.context["usage_totals"]
    assert [(row["key"], row["prompt_tokens"], row["cost"]) for row in by_model[1]] == [
        ("scripted-model", 1000, pytest.approx(0.0028))
    ]
    assert [row["key"] for row in by_user[1]] == ["owner_a"]
    assert b"Usage of the calls listed" in response.content
