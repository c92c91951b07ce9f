"""Durable approvals in the runtime (ARCHITECTURE §2, §6; SCENARIOS S2).

A tool call that a policy marks `require_approval` suspends the turn: the call, its result id
(the call id) and the pending request are committed as one RuntimeAuditUnit together with the
`waiting_approval` status, and the runner leaves. A decision is an input like any other
(`approval_decision`, entered by `brain.submit_decision`, which this module never imports: the
Brain drives the runtime, not the other way round); a later runner executes the *original* call
exactly once (approve) or commits a rejection as that call's result (reject/expire) and the
turn goes on. Prompt text cannot change any of this: the policy sees only the call.

Every PendingApproval write is an `approvals_app.actions.do_*`; the Session status around it
(`waiting_approval`, `running`) is SessionEngine's `set_status`, called here.
"""

from __future__ import annotations

from django.db.models import OuterRef, Q, Subquery

from approvals_app import actions as approvals
from approvals_app.choices import ApprovalStatus
from approvals_app.models import PendingApproval
from tenancy_app.choices import ADMIN_ROLES
from tenancy_app.choices import Role as TenantRole
from tenancy_app.models import Membership

from ..choices import InputKind, Role, SessionStatus
from ..models import Message, Session
from . import engine

# --- the policy hook ToolService calls ------------------------------------------------------------


def call_facts(tool):
    from tools_app.catalog import policy_facts

    return policy_facts(tool)


def verdict_for(tenant_id: int, tool, args: dict, rules=None):
    """The tenant's verdict on one call (`rules`: the slice's loaded `policy.tenant_rules`, or
    read now) — the whole Verdict, so a deny carries its rule's reason."""
    from approvals_app.policy import evaluate

    return evaluate(tenant_id, call_facts(tool), args, rules=rules)


# --- suspend ---------------------------------------------------------------------------------------


def suspend(
    session_id,
    token,
    *,
    turn_id: int,
    assistant_message_id: int,
    tool,
    call_id: str,
    arguments: dict,
    remaining_call_ids: list[str],
    redactor,
    verdict=None,
) -> PendingApproval:
    """Park the turn on a RuntimeAuditUnit: approval row + event + status in one transaction.

    `verdict`: the policy's verdict ToolService already reached (`ApprovalRequired.verdict`);
    evaluated here only when a caller has none."""
    with engine.locked_session(session_id, token) as session:
        if verdict is None or not hasattr(verdict, "expires_after_hours"):
            verdict = verdict_for(session.tenant_id, tool, arguments)
        approval = approvals.do_request_approval(
            session,
            turn_id=turn_id,
            assistant_message_id=assistant_message_id,
            call_id=call_id,
            tool=tool.name,
            tool_source=call_facts(tool).source,
            risk=str(tool.risk),
            arguments=arguments,
            arguments_redacted=redactor.redact_data(arguments),
            verdict=verdict,
            remaining_call_ids=remaining_call_ids,
        )
        engine.set_status(session, SessionStatus.WAITING_APPROVAL, f"waiting for approval of {tool.name}")
    return approval


# --- decide ----------------------------------------------------------------------------------------


def with_session_owner(queryset):
    """`queryset` with each approval's Session owner (`session_owner_id`) read in the same query,
    so `may_decide` over a page of approvals costs no query per approval."""
    owner = Session.objects.filter(pk=OuterRef("session_id")).values("owner_id")[:1]
    return queryset.annotate(session_owner_id=Subquery(owner))


def may_decide(approval: PendingApproval, user, membership=None) -> bool:
    """May `user` decide `approval`? Pass the `membership` the caller already resolved (REST,
    WebSocket) and an approval from `with_session_owner` to need no query at all."""
    from approvals_app.policy import can_decide

    if user is None or not getattr(user, "is_authenticated", False):
        return False
    if membership is None:
        membership = Membership.objects.filter(tenant_id=approval.tenant_id, user=user).first()
    if membership is None or membership.user_id != user.pk or membership.tenant_id != approval.tenant_id:
        return False
    if hasattr(approval, "session_owner_id"):
        owner_id = approval.session_owner_id
    else:
        owner_id = Session.objects.filter(pk=approval.session_id).values_list("owner_id", flat=True).first()
    return can_decide(
        approval.deciders or {}, user_id=user.pk, session_owner_id=owner_id, role=membership.role
    )


def may_answer_input(request, user, membership=None) -> bool:
    """May `user` answer an MCP input request (elicitation) of a Session? The same people who may
    decide that Session's approvals under the default deciders: its owner and the tenant's
    owners and admins (a server's question is not matched by any approval rule)."""
    from approvals_app.policy import can_decide, default_deciders

    if user is None or not getattr(user, "is_authenticated", False):
        return False
    if membership is None:
        membership = Membership.objects.filter(tenant_id=request.tenant_id, user=user).first()
    if membership is None or membership.user_id != user.pk or membership.tenant_id != request.tenant_id:
        return False
    owner_id = Session.objects.filter(pk=request.session_id).values_list("owner_id", flat=True).first()
    return can_decide(default_deciders(), user_id=user.pk, session_owner_id=owner_id, role=membership.role)


def visible_to(queryset, user, membership):
    """The approvals of `queryset` this person may see, as one query filter (list, detail, decide
    and a Session's sub-list all use it, so what is absent from a list is a 404 on its own route).

    Tenant owners and admins see every approval of the tenant; other members see the approvals of
    their own Sessions and those whose deciders name their role — exactly the ones `may_decide`
    could allow them, plus their own. No membership (or another tenant's): nothing.
    """
    if membership is None or user is None or not getattr(user, "is_authenticated", False):
        return queryset.none()
    if membership.user_id != user.pk:
        return queryset.none()
    queryset = queryset.filter(tenant_id=membership.tenant_id)
    if membership.role in ADMIN_ROLES:
        return queryset
    own_sessions = Session.objects.filter(tenant_id=membership.tenant_id, owner_id=user.pk).values("pk")
    # `deciders.roles` is stored normalized (sorted, unique, known roles), so it has at most one
    # entry per role; comparing each position works on SQLite and PostgreSQL alike (a JSON
    # "contains" lookup does not exist on SQLite).
    named_role = Q()
    for index in range(len(TenantRole.values)):
        named_role |= Q(**{f"deciders__roles__{index}": membership.role})
    return queryset.filter(Q(session_id__in=own_sessions) | named_role)


def may_see(approval: PendingApproval, user) -> bool:
    membership = Membership.objects.filter(tenant_id=approval.tenant_id, user=user).first()
    return visible_to(PendingApproval.objects.filter(pk=approval.pk), user, membership).exists()


# --- resume / cancel (inside a runner slice) ----------------------------------------------------


def _waiting_approval(session_id) -> PendingApproval | None:
    return (
        PendingApproval.objects.filter(session_id=session_id, executed_at__isnull=True)
        .exclude(status=ApprovalStatus.CANCELLED)
        .order_by("-id")
        .first()
    )


def call_spec(approval: PendingApproval, call_id: str) -> dict:
    """The model's tool call `call_id` as it stands in the assistant message the approval parked."""
    message = Message.objects.get(pk=approval.assistant_message_id)
    return next(c for c in message.tool_calls if c["id"] == call_id)


def take_decision(session_id, token) -> tuple[PendingApproval | None, int]:
    """Consume decision inputs for the parked turn: (the decided approval or None, inputs consumed)."""
    with engine.locked_session(session_id, token) as session:
        decisions = list(engine.queued_inputs(session.pk, [InputKind.APPROVAL_DECISION]))
        if not decisions:
            return None, 0
        engine.consume_inputs(decisions, session.current_turn)
        approval = _waiting_approval(session.pk)
        if approval is None or approval.status == ApprovalStatus.PENDING:
            return None, len(decisions)
        engine.set_status(session, SessionStatus.RUNNING)
        return approval, len(decisions)


def cancel_waiting(session: Session) -> None:
    """Interrupt while parked (caller holds the lock): cancel the approval and close its calls."""
    approval = _waiting_approval(session.pk)
    if approval is None:
        return
    approvals.do_cancel(session, approval)
    for call_id in [approval.call_id, *approval.remaining_call_ids]:
        if not Message.objects.filter(session_id=session.pk, role=Role.TOOL, tool_call_id=call_id).exists():
            engine.record_tool_result(
                session,
                session.current_turn_id,
                call_id=call_id,
                tool=call_spec(approval, call_id)["name"],
                content="Not run: the user interrupted the turn while it waited for approval.",
                ok=False,
                summary="cancelled by interrupt",
            )
    # Even one approved before the interrupt but not yet run: its calls are closed, it never runs.
    approvals.do_mark_handled(approval)


def rejection_text(approval: PendingApproval) -> str:
    verb = {ApprovalStatus.REJECTED: "rejected", ApprovalStatus.EXPIRED: "expired without a decision"}.get(
        approval.status, str(approval.status)
    )
    who = f" by {approval.decided_by.get_username()}" if approval.decided_by_id else ""
    note = (
        f" Comment: {approval.comment}"
        if approval.comment and approval.status == ApprovalStatus.REJECTED
        else ""
    )
    return f"Not run: this call needed approval and was {verb}{who}.{note} Do not retry it unchanged."


def outcome_summary(approval: PendingApproval) -> str:
    """The one line a tool card shows for a call that did not run."""
    return {
        ApprovalStatus.REJECTED: "rejected by a person",
        ApprovalStatus.EXPIRED: "expired without a decision",
    }.get(approval.status, str(approval.status))
