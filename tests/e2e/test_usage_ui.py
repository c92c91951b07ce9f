"""The Usage page in Chromium against the real `runstack` (SQLite, in-process worker): a Session's
model calls, answered by the scripted server with fixed usage and priced by the demo tenant's
model configuration, show as charts drawn on the server (SVG, nothing from a CDN) and as totals
equal to what `/api/v1/usage/` reports."""

import re

import pytest

from tests.support.model_server import ScriptedModelServer, json_reply, text_reply

from ..integration.processes import served_embedded
from .test_workspace import LIVE_TIMEOUT_MS, SESSION_URL, assistant_messages, expect, log_in

USAGE = {"prompt_tokens": 1000, "completion_tokens": 100}
ANSWER = "The quarterly numbers are summarised."

SETUP = """
from django.contrib.auth import get_user_model
from sessions_app.models import ModelConfig, Quota
from tenancy_app.models import Tenant

ModelConfig.objects.update_or_create(
    tenant=Tenant.objects.get(slug="demo"), name="scripted",
    defaults=dict(
        base_url="{base_url}", model="scripted-model", is_default=True, configured_by_operator=True,
        input_price="2", output_price="8",
    ),
)
# carol may use 1,000 tokens a day: her first call passes, the next waits.
Quota.objects.create(
    tenant=Tenant.objects.get(slug="demo"), user=get_user_model().objects.get(username="carol"),
    period="day", max_tokens=1000,
)
"""


@pytest.fixture(scope="module")
def model_server():
    with ScriptedModelServer() as server:
        server.default("agent", lambda request: text_reply(ANSWER, usage=USAGE))
        server.default(
            "task_relation",
            json_reply(
                {
                    "task_relation": "new_task",
                    "skill_recall_terms": [],
                    "tool_recall_terms": [],
                    "memory_recall_terms": [],
                },
                usage=USAGE,
            ),
        )
        server.default("orchestrate", json_reply({"skills": [], "toolsets": [], "tools": []}, usage=USAGE))
        yield server


@pytest.fixture(scope="module")
def stack(tmp_path_factory, model_server):
    root = tmp_path_factory.mktemp("usage-stack")
    with served_embedded(
        root,
        ("seed_demo",),
        ("create_user", "carol", "--tenant", "demo", "--password", "carol-password-1"),
        ("shell", "-c", SETUP.format(base_url=model_server.base_url)),
    ) as served:
        yield served


def test_the_usage_page_charts_a_sessions_priced_calls(page, stack, tmp_path):
    log_in(page)
    page.get_by_test_id("new-session-title").fill("Quarterly numbers")
    page.get_by_test_id("new-session-goal").fill("Summarise the quarterly numbers.")
    page.get_by_test_id("new-session-submit").click()
    expect(page).to_have_url(SESSION_URL)
    expect(assistant_messages(page).last).to_contain_text(ANSWER, timeout=LIVE_TIMEOUT_MS)

    page.get_by_test_id("nav-usage").click()
    expect(page).to_have_url(re.compile(r"/usage/$"))
    expect(page.get_by_test_id("usage-chart-days").locator("[data-testid=usage-point]")).to_have_count(1)
    expect(page.get_by_test_id("usage-chart-users").locator("[data-testid=usage-point]")).to_have_count(1)
    expect(page.get_by_test_id("usage-chart-models")).to_contain_text("scripted-model")
    # The bar has a height: the chart is drawn from the data, not an empty frame.
    assert float(page.get_by_test_id("usage-chart-days").locator("rect").first.get_attribute("height")) > 0

    totals = page.request.get("/api/v1/usage/?group_by=model").json()
    [row] = totals["results"]
    calls = row["calls"]
    assert row["prompt_tokens"] == calls * USAGE["prompt_tokens"]
    # 1,000 × 2 + 100 × 8 per million tokens, per call.
    assert row["cost"] == pytest.approx(calls * 0.0028)
    expect(page.get_by_test_id("usage-total-cost")).to_have_text(f"{row['cost']:.4f} {totals['currency']}")
    page.screenshot(path=str(tmp_path / "usage-page.png"), full_page=True)


def test_a_spent_quota_shows_a_card_naming_the_limit_and_keeps_the_message(page, stack):
    log_in(page, "carol", "carol-password-1")
    page.get_by_test_id("new-session-title").fill("Carol's numbers")
    page.get_by_test_id("new-session-goal").fill("Summarise the quarterly numbers.")
    page.get_by_test_id("new-session-submit").click()
    expect(page).to_have_url(SESSION_URL)
    expect(assistant_messages(page).last).to_contain_text(ANSWER, timeout=LIVE_TIMEOUT_MS)

    page.get_by_test_id("composer-input").fill("And the yearly ones?")
    page.get_by_test_id("send-button").click()
    card = page.get_by_test_id("quota-exceeded")
    expect(card).to_be_visible(timeout=LIVE_TIMEOUT_MS)
    expect(card.get_by_test_id("quota-exceeded-limit")).to_contain_text(
        "daily quota of 1,000 tokens is spent"
    )
    expect(card).to_contain_text("admin")
    expect(page.get_by_test_id("session-status")).to_contain_text("queued")
    # The message is kept: it is in the conversation, and the card is still there after a reload.
    expect(page.locator("[data-testid=message][data-role=user]").last).to_contain_text("And the yearly ones?")
    page.reload()
    expect(page.get_by_test_id("quota-exceeded")).to_have_count(1)


def test_the_usage_page_shows_the_quotas_that_apply_and_other_periods(page, stack):
    log_in(page, "carol", "carol-password-1")
    page.goto("/usage/")
    [quota] = page.get_by_test_id("usage-quota").all()
    expect(quota).to_contain_text("carol")
    expect(quota).to_contain_text("1000 tokens")
    page.get_by_test_id("usage-days").select_option("7")
    page.get_by_role("button", name="Show").click()
    expect(page).to_have_url(re.compile(r"/usage/\?days=7$"))
    expect(page.get_by_test_id("usage-page")).to_contain_text("the last 7 days")
