"""The scripted demo model on the real loop (no LLM configured): it reads the results of its own
calls, stops at the first failure and says which call failed, and never claims a report it did
not make. Success answers quote the headline KPIs, recomputed here with a CSV parser."""

import csv
import io
import json
import shutil
import statistics
from pathlib import Path

import pytest

from approvals_app.choices import PolicyAction
from approvals_app.models import PendingApproval
from approvals_app.policy_models import ApprovalPolicy, ApprovalRule
from sessions_app.models import Message, PlanTask, Turn
from sessions_app.runtime import brain, engine
from sessions_app.runtime.llm import demo
from sessions_app.runtime.llm.config import resolve_model
from tools_app.models import Tool, ToolSet

from .helpers import assert_tool_pairs, drive_until_idle, new_session, send

pytestmark = pytest.mark.django_db(transaction=True)

TICKETS = Path(demo.__file__).resolve().parents[2] / "demo_data" / "tickets.csv"
ASK = "tickets.csv holds last week's support tickets. Build the HTML weekly KPI report and kpis.csv."
ASK_WITH_CLEANUP = ASK + " Then delete the scratch file draft_to_delete.md."
CLAIMS = ("ready", "validated")


@pytest.fixture(autouse=True)
def no_llm_configured(settings, monkeypatch):
    settings.OPENAI_API_KEY = ""
    monkeypatch.setattr(demo, "STREAM_CHUNK_DELAY_S", 0)


@pytest.fixture
def session(tenant_a, owner_a):
    session = new_session(tenant_a, owner_a)
    assert resolve_model(session).provider == "demo"
    return session


def _upload_tickets(session):
    shutil.copy(TICKETS, engine.workspace_path(session) / "tickets.csv")


def _answer(session) -> str:
    return Message.objects.filter(session=session, role="assistant").order_by("id").last().content


def _calls(session, name=None) -> list[dict]:
    calls = [
        call
        for message in Message.objects.filter(session=session, role="assistant").order_by("id")
        for call in message.tool_calls
    ]
    return [c for c in calls if name is None or c["name"] == name]


def _headline_numbers() -> dict:
    rows = list(csv.DictReader(TICKETS.open(newline="")))
    resolved = [r for r in rows if r["status"] == "resolved"]
    return {
        "total": f"{len(rows)} tickets",
        "resolved": f"{len(resolved)} resolved",
        "rate": f"{round(100 * len(resolved) / len(rows), 1)}%",
        "first_response": f"{round(statistics.mean(float(r['first_response_minutes']) for r in rows), 1)} minutes",
        "csat": f"CSAT {round(statistics.mean(int(r['csat']) for r in resolved), 2)}",
    }


def test_a_finished_report_is_answered_with_its_headline_numbers(session):
    _upload_tickets(session)
    send(session, ASK)
    drive_until_idle(session)

    assert Turn.objects.get(session=session).reason == "completed"
    workspace = engine.workspace_path(session)
    assert (workspace / "report.html").is_file() and (workspace / "kpis.csv").is_file()
    answer = _answer(session)
    for label, number in _headline_numbers().items():
        assert number in answer, (label, answer)
    assert "report.html" in answer and "kpis.csv" in answer and "reopened" in answer
    assert "validated" not in answer
    assert [c["name"] for c in _calls(session)] == [
        "plan_create",
        "fs_read",
        "fs_write",
        "fs_write",
        "fs_read",
        "fs_read",
        "task_complete",
        "task_complete",
        "task_complete",
    ]
    assert set(PlanTask.objects.filter(plan__session=session).values_list("status", flat=True)) == {"done"}
    assert_tool_pairs(session)


def test_an_offered_report_skill_is_loaded_first_then_the_report_is_played(session, tenant_a):
    from skills_app import packaging

    demo_skill = Path(packaging.__file__).parent / "demo_data" / "skills" / "support-weekly-report"
    packaging.import_package(packaging.read_folder(demo_skill), tenant=tenant_a, by="test")
    _upload_tickets(session)
    send(session, ASK)
    drive_until_idle(session)

    assert Turn.objects.get(session=session).reason == "completed"
    names = [c["name"] for c in _calls(session)]
    assert names[:3] == ["skills_load", "plan_create", "fs_read"] and names.count("skills_load") == 1
    load = Message.objects.get(
        session=session, role="tool", tool_call_id=_calls(session, "skills_load")[0]["id"]
    )
    assert '"accepted_skill_ids"' in load.content and not load.is_error
    assert session.capabilities.filter(kind="skill", name="support-weekly-report").exists()
    for number in _headline_numbers().values():
        assert number in _answer(session)
    # A second report in the same Session does not load it again (it is no longer offered).
    send(session, ASK)
    drive_until_idle(session)
    assert [c["name"] for c in _calls(session)].count("skills_load") == 1


def test_without_tickets_csv_it_says_so_and_claims_no_report(session):
    send(session, ASK)
    drive_until_idle(session)

    assert Turn.objects.get(session=session).reason == "completed"
    answer = _answer(session)
    assert "could not read tickets.csv" in answer and "does not exist" in answer
    assert "Upload tickets.csv" in answer
    assert not any(claim in answer.lower() for claim in CLAIMS)
    assert _calls(session, "fs_write") == [] and _calls(session, "task_complete") == []
    workspace = engine.workspace_path(session)
    assert not (workspace / "report.html").exists() and not (workspace / "kpis.csv").exists()


def test_a_failed_write_is_named_and_nothing_is_claimed(session):
    _upload_tickets(session)
    (engine.workspace_path(session) / "report.html").mkdir()  # fs_write cannot replace a directory
    send(session, ASK)
    drive_until_idle(session)

    answer = _answer(session)
    assert "could not write report.html" in answer and "is a directory" in answer
    assert "Written: kpis.csv" in answer
    assert "could not write kpis.csv" not in answer
    assert not any(claim in answer.lower() for claim in CLAIMS)
    assert _calls(session, "task_complete") == []  # no plan task is marked done
    assert len(_calls(session, "fs_read")) == 1  # nothing reopened after the failure


def test_a_write_rejected_by_a_person_is_named_in_the_answer(session, tenant_a, owner_a):
    policy = ApprovalPolicy.objects.create(tenant=tenant_a, name="Careful writes", priority=1)
    ApprovalRule.objects.create(
        tenant=tenant_a, policy=policy, tool_glob="fs_write", action=PolicyAction.REQUIRE_APPROVAL
    )
    _upload_tickets(session)
    send(session, ASK)
    drive_until_idle(session)
    assert session.status == "waiting_approval"
    brain.submit_decision(PendingApproval.objects.get(session_id=session.pk), "reject", user=owner_a)
    drive_until_idle(session)
    # The second write waits for its own decision; approve it.
    brain.submit_decision(
        PendingApproval.objects.get(session_id=session.pk, status="pending"), "approve", user=owner_a
    )
    drive_until_idle(session)

    assert Turn.objects.get(session=session).reason == "completed"
    answer = _answer(session)
    assert "could not write report.html: Not run: this call needed approval and was rejected" in answer
    assert "Written: kpis.csv" in answer
    assert not any(claim in answer.lower() for claim in CLAIMS)
    assert not (engine.workspace_path(session) / "report.html").exists()


def test_a_rejected_cleanup_is_reported_and_the_report_still_stands(tenant_a, owner_a):
    cleanup = ToolSet.objects.create(tenant=tenant_a, name="cleanup", is_default=True)
    cleanup.tools.add(Tool.objects.get(tenant=None, name="fs_delete_files"))
    session = new_session(tenant_a, owner_a)  # after the tool set: a new Session gets default sets
    _upload_tickets(session)
    (engine.workspace_path(session) / demo.CLEANUP_FILE).write_text("scratch")
    send(session, ASK_WITH_CLEANUP)
    drive_until_idle(session)
    approval = PendingApproval.objects.get(session_id=session.pk)
    assert approval.tool == "fs_delete_files"
    brain.submit_decision(approval, "reject", user=owner_a, comment="keep it")
    drive_until_idle(session)

    answer = _answer(session)
    assert f"I did not delete {demo.CLEANUP_FILE}: Not run:" in answer
    assert _headline_numbers()["total"] in answer
    assert (engine.workspace_path(session) / demo.CLEANUP_FILE).exists()


def test_call_ids_are_unique_across_turns_of_one_session(session):
    _upload_tickets(session)
    send(session, ASK)
    drive_until_idle(session)
    send(session, "Build the weekly KPI report again, please.")
    drive_until_idle(session)

    assert list(Turn.objects.filter(session=session).values_list("reason", flat=True)) == ["completed"] * 2
    ids = [c["id"] for c in _calls(session)]
    assert len(ids) == 18 and len(set(ids)) == 18
    assert all(i.startswith("call_") for i in ids)
    assert_tool_pairs(session)


def _wire_call(call_id, name, arguments):
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def test_results_are_matched_to_calls_by_id_not_position():
    """Only the messages decide: results listed out of order still reach the right call."""
    provider = demo.DemoModelProvider(model=None)
    table = "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(TICKETS.read_text().splitlines(), 1))
    messages = [
        {"role": "system", "content": "You are xAgent."},
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [_wire_call("p", "plan_create", {})]},
        {"role": "tool", "tool_call_id": "p", "content": '{"title": "x", "tasks": []}'},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_wire_call("r", "fs_read", {"path": "tickets.csv"})],
        },
        {"role": "tool", "tool_call_id": "r", "content": table},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                _wire_call("w1", "fs_write", {"path": "report.html", "content": "..."}),
                _wire_call("w2", "fs_write", {"path": "kpis.csv", "content": "..."}),
            ],
        },
        {"role": "tool", "tool_call_id": "w2", "content": "error in runtime (os_error): disk full"},
        {"role": "tool", "tool_call_id": "w1", "content": "created report.html (1.9 KB)"},
    ]
    result = provider.complete(messages, [], purpose="agent")
    assert result.tool_calls == [] and result.finish_reason == "stop"
    assert "could not write kpis.csv: disk full" in result.text
    assert "Written: report.html" in result.text

    first = provider.complete(messages[:2], [], purpose="agent").tool_calls
    second = provider.complete(messages[:2], [], purpose="agent").tool_calls
    assert [(c["name"], c["arguments"]) for c in first] == [(c["name"], c["arguments"]) for c in second]
    assert first[0]["id"] != second[0]["id"]


def test_a_long_tickets_csv_is_read_page_by_page():
    provider = demo.DemoModelProvider(model=None)
    lines = TICKETS.read_text().splitlines()
    page = "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(lines[:30], 1))
    more = f"\n…[lines 1-30 of {len(lines)} shown; call fs_read with offset=31 to continue]"
    messages = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [_wire_call("p", "plan_create", {})]},
        {"role": "tool", "tool_call_id": "p", "content": "{}"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_wire_call("r1", "fs_read", {"path": "tickets.csv"})],
        },
        {"role": "tool", "tool_call_id": "r1", "content": page + more},
    ]
    (call,) = provider.complete(messages, [], purpose="agent").tool_calls
    assert (call["name"], json.loads(call["arguments"])) == ("fs_read", {"path": "tickets.csv", "offset": 31})

    rest = "\n".join(f"{n:>6}\t{line}" for n, line in enumerate(lines[30:], 31))
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_wire_call("r2", "fs_read", json.loads(call["arguments"]))],
        },
        {"role": "tool", "tool_call_id": "r2", "content": rest},
    ]
    writes = provider.complete(messages, [], purpose="agent").tool_calls
    written = json.loads(writes[1]["arguments"])
    assert written["path"] == "kpis.csv"
    kpis = {row["metric"]: row["value"] for row in csv.DictReader(io.StringIO(written["content"]))}
    assert kpis["tickets_total"] == str(len(lines) - 1)


def test_the_demo_model_plays_s6_in_a_sub_session(tenant_a, owner_a):
    main = new_session(tenant_a, owner_a)
    sub = new_session(tenant_a, owner_a, kind="sub", parent=main)
    relations = []
    for text in (
        "Research ComfyUI and deliver a Markdown guide",
        "Continue",
        "Convert the Markdown to Word",
        "Also check tomorrow's weather",
    ):
        send(sub, text)
        drive_until_idle(sub)
        relations.append(
            sub.events.filter(type="task.understood").order_by("-seq").first().data["task_relation"]
        )
        assert sub.status == "idle"
    assert relations == ["new_task", "continue_current", "change_within_session", "out_of_scope"]
    assert sub.phase_goal == "Convert the Markdown to Word"


def test_in_a_goal_run_it_claims_the_goal_before_its_closing_answer(session, owner_a):
    """`make run`'s goal runs end the seed's way with the demo model too: the report written and
    checked, update_goal complete, the closing answer; the records agree, so the run is done."""
    from sessions_app.runtime import goal_driver

    _upload_tickets(session)
    run = goal_driver.start(
        session.pk, goal=ASK, max_rounds=3, token_budget=1_000_000, wall_clock_seconds=3600, user=owner_a
    )

    drive_until_idle(session)

    run.refresh_from_db()
    (claim,) = _calls(session, "update_goal")
    assert json.loads(claim["arguments"])["status"] == "complete"
    assert (run.status, run.rounds_done) == ("done", 1), run.last_reason
    assert _answer(session).startswith(demo.REPORT_DONE)
    assert_tool_pairs(session)


def test_in_a_goal_run_without_tickets_it_says_it_is_blocked(session, owner_a):
    from sessions_app.runtime import goal_driver

    run = goal_driver.start(
        session.pk, goal=ASK, max_rounds=3, token_budget=1_000_000, wall_clock_seconds=3600, user=owner_a
    )

    drive_until_idle(session)

    run.refresh_from_db()
    assert (run.status, run.rounds_done) == ("stopped", 1)
    assert run.last_reason.startswith("round 1: the agent said it is blocked: I could not read tickets.csv")


# --- the delivery record's outcome: one owner for the API and the card ---------------------------


def _delivery(session) -> dict:
    from sessions_app.api.serializers import DeliverySerializer
    from sessions_app.models import Delivery

    return DeliverySerializer(Delivery.objects.filter(session=session).order_by("-id").first()).data


def _tickets_from_before(session):
    """tickets.csv as a person uploaded it earlier (not a file this turn produced)."""
    import os
    import time

    _upload_tickets(session)
    earlier = time.time() - 3600
    os.utime(engine.workspace_path(session) / "tickets.csv", (earlier, earlier))


def test_a_turn_of_words_only_has_nothing_delivered(session):
    send(session, "What can you do?")  # the demo explains itself: no file, no check
    drive_until_idle(session)

    delivery = _delivery(session)
    assert (delivery["outcome"], delivery["files"], delivery["checks"]) == ("nothing_delivered", [], [])


def test_a_report_written_and_checked_is_delivered(session):
    _tickets_from_before(session)
    send(session, ASK)
    drive_until_idle(session)

    delivery = _delivery(session)
    assert delivery["outcome"] == "delivered" and delivery["checks_ok"]
    assert {f["path"] for f in delivery["files"]} == {"report.html", "kpis.csv"}


def test_a_rejection_is_a_decision_not_a_tool_failure(session, tenant_a, owner_a):
    policy = ApprovalPolicy.objects.create(tenant=tenant_a, name="Careful writes", priority=1)
    ApprovalRule.objects.create(
        tenant=tenant_a, policy=policy, tool_glob="fs_write", action=PolicyAction.REQUIRE_APPROVAL
    )
    _tickets_from_before(session)
    send(session, ASK)
    drive_until_idle(session)
    rejected = PendingApproval.objects.get(session_id=session.pk)
    brain.submit_decision(rejected, "reject", comment="not this week", user=owner_a)
    drive_until_idle(session)
    brain.submit_decision(
        PendingApproval.objects.get(session_id=session.pk, status="pending"), "approve", user=owner_a
    )
    drive_until_idle(session)

    delivery = _delivery(session)
    assert delivery["unresolved_failures"] == []
    assert delivery["decisions"] == [
        {
            "call_id": rejected.call_id,
            "tool": "fs_write",
            "decision": "rejected",
            "by": owner_a.get_username(),
            "comment": "not this week",
        }
    ]
    assert delivery["outcome"] == "delivered"  # kpis.csv was written and passed its check


def test_a_deny_rule_is_a_decision_and_a_failed_read_a_failure(session, tenant_a):
    policy = ApprovalPolicy.objects.create(tenant=tenant_a, name="No writes", priority=1)
    ApprovalRule.objects.create(
        tenant=tenant_a,
        policy=policy,
        tool_glob="fs_write",
        action=PolicyAction.DENY,
        reason="read-only week",
    )
    _tickets_from_before(session)
    send(session, ASK)
    drive_until_idle(session)

    delivery = _delivery(session)
    assert [d["decision"] for d in delivery["decisions"]] == ["denied", "denied"]
    assert "read-only week" in delivery["decisions"][0]["comment"]
    assert delivery["unresolved_failures"] == [] and delivery["outcome"] == "nothing_delivered"

    other = new_session(tenant_a, session.owner)
    send(other, ASK)  # no tickets.csv: the read fails
    drive_until_idle(other)
    failed = _delivery(other)
    assert failed["outcome"] == "failed" and failed["unresolved_failures"][0]["tool"] == "fs_read"
