"""approvals_app.actions: the only writer of PendingApproval rows. Each `do_*` is a guarded,
compare-and-set transition that writes the row, logs it and emits its event exactly once."""

import json
import logging

import pytest

from approvals_app import actions
from approvals_app.choices import ApprovalStatus
from approvals_app.models import PendingApproval
from approvals_app.policy import Verdict
from approvals_app.policy_models import default_deciders
from sessions_app.models import SessionEvent
from sessions_app.runtime import engine
from tests.runtime.helpers import new_session

pytestmark = pytest.mark.django_db


@pytest.fixture
def session(tenant_a, owner_a):
    return new_session(tenant_a, owner_a, title="cleanup")


@pytest.fixture
def approval(session):
    verdict = Verdict(
        action="require_approval",
        rule={"id": 1},
        reason="Destructive action: a person must approve it.",
        deciders=default_deciders(),
        expires_after_hours=72,
    )
    with engine.locked_session(session.pk) as locked:
        return actions.do_request_approval(
            locked,
            turn_id=1,
            assistant_message_id=1,
            call_id="del",
            tool="fs_delete_files",
            tool_source="native",
            risk="destructive",
            arguments={"paths": ["draft.md"]},
            arguments_redacted={"paths": ["draft.md"]},
            verdict=verdict,
            remaining_call_ids=["after"],
        )


def events(session, type):
    return [
        json.loads(json.dumps(e.as_dict())) for e in SessionEvent.objects.filter(session=session, type=type)
    ]


def test_a_request_is_the_row_and_its_event(session, approval, owner_a):
    assert approval.status == ApprovalStatus.PENDING and approval.expires_at is not None
    assert approval.requested_by == owner_a and approval.remaining_call_ids == ["after"]
    [requested] = events(session, "approval.requested")
    assert requested["data"] == {
        "approval_id": approval.pk,
        "call_id": "del",
        "tool": "fs_delete_files",
        "risk": "destructive",
        "reason": "Destructive action: a person must approve it.",
    }


def test_a_decision_wins_once(session, approval, owner_a, caplog):
    with caplog.at_level(logging.INFO, logger="approvals_app.actions"):
        with engine.locked_session(session.pk) as locked:
            actions.do_decide(locked, approval, ApprovalStatus.APPROVED, user=owner_a, comment="fine")
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by == owner_a
    assert approval.comment == "fine" and approval.decided_at is not None
    assert f"approval {approval.pk} approved by owner_a" in caplog.text
    with pytest.raises(actions.AlreadyDecided), engine.locked_session(session.pk) as locked:
        actions.do_decide(locked, approval, ApprovalStatus.REJECTED, user=owner_a)
    assert PendingApproval.objects.get(pk=approval.pk).status == ApprovalStatus.APPROVED
    [decided] = events(session, "approval.decided")
    assert decided["data"] == {"approval_id": approval.pk, "decision": "approved", "by": "owner_a"}


@pytest.mark.parametrize("status", [ApprovalStatus.PENDING, ApprovalStatus.CANCELLED, "maybe"])
def test_it_refuses_a_status_that_is_no_decision(session, approval, status):
    with pytest.raises(ValueError), engine.locked_session(session.pk) as locked:
        actions.do_decide(locked, approval, status)
    assert PendingApproval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


def test_expiry_is_decided_by_the_system(session, approval):
    with engine.locked_session(session.pk) as locked:
        actions.do_decide(locked, approval, ApprovalStatus.EXPIRED, comment="expired without a decision")
    assert approval.decided_by is None
    assert events(session, "approval.decided")[0]["data"]["by"] == "system"


def test_a_cancel_loses_to_an_earlier_decision(session, approval, owner_a):
    with engine.locked_session(session.pk) as locked:
        actions.do_decide(locked, approval, ApprovalStatus.REJECTED, user=owner_a)
        assert actions.do_cancel(locked, approval) is False
    assert approval.status == ApprovalStatus.REJECTED
    assert [e["data"]["decision"] for e in events(session, "approval.decided")] == ["rejected"]


def test_a_cancel_of_a_pending_approval(session, approval):
    with engine.locked_session(session.pk) as locked:
        assert actions.do_cancel(locked, approval) is True
    assert approval.status == ApprovalStatus.CANCELLED
    [cancelled] = events(session, "approval.decided")
    assert cancelled["data"] == {"approval_id": approval.pk, "decision": "cancelled", "by": "interrupt"}


def test_an_approved_call_is_claimed_once(session, approval, owner_a):
    assert actions.do_claim_execution(approval) is False  # not approved yet
    with engine.locked_session(session.pk) as locked:
        actions.do_decide(locked, approval, ApprovalStatus.APPROVED, user=owner_a)
    assert actions.do_claim_execution(approval) is True
    assert actions.do_claim_execution(approval) is False
    actions.do_record_execution(approval, "deleted 1 file")
    assert PendingApproval.objects.get(pk=approval.pk).execution_result == "deleted 1 file"
    assert actions.do_mark_handled(approval) is False  # already claimed


def test_a_rejection_is_handled_once(session, approval, owner_a):
    with engine.locked_session(session.pk) as locked:
        actions.do_decide(locked, approval, ApprovalStatus.REJECTED, user=owner_a)
    assert actions.do_mark_handled(approval) is True
    assert actions.do_mark_handled(approval) is False
    assert actions.do_claim_execution(approval) is False
