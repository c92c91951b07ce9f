"""Browser workspace pages. They render the frame and the facts a page needs to start;
everything live (messages, plan, status, events) comes from the REST API and the
Session WebSocket, read by static/js with the browser session."""

from datetime import timedelta

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.templatetags.static import static
from django.utils import timezone
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_safe

from tenancy_app.access import SESSION_TENANT_KEY, resolve_membership
from tenancy_app.choices import ADMIN_ROLES
from tenancy_app.models import Membership
from tools_app.registry import DELEGATE_TOOL, default_tool_names

from . import quotas, usage, usage_charts
from .api.serializers import GoalRunCreateSerializer, GoalRunSerializer
from .choices import MemoryKind, SessionKind, SessionStatus
from .models import Session
from .runtime import goal_driver

# The periods the Usage page offers, in days.
USAGE_PERIODS = ("7", "30", "90")

# How many logged events before the page's snapshot the activity log shows on open.
EVENT_LOG_BACKLOG = 300


@require_safe
@cache_control(max_age=86400, public=True)
def favicon(request):
    """`/favicon.ico` for clients that ask before reading the page's `<link rel=icon>` (JSON
    responses, raw files): the static SVG, so no request for it ends in a 404."""
    return HttpResponseRedirect(static("img/favicon.svg"))


@login_required
def home(request):
    """The tenant's Sessions (listed by static/js/home.js from the API) and a new-session form."""
    return render(
        request,
        "workspace/home.html",
        {"embedded": settings.EMBEDDED, "session_statuses": SessionStatus.choices},
    )


@login_required
def session_detail(request, session_id):
    """One Session: conversation, plan, composer and activity log, kept live over the WebSocket.

    The tenant is resolved exactly as the page header's picker resolves it; another tenant's
    Session (or an archived one) is a 404, never a 403 that would confirm it exists.
    """
    membership = resolve_membership(request.user, request.session.get(SESSION_TENANT_KEY))
    if membership is None:
        raise Http404("No Session matches the given query.")
    session = get_object_or_404(
        Session.objects.for_tenant(membership.tenant), pk=session_id, archived_at__isnull=True
    )
    # `last_event_seq` and `status` come from the same row read: the page's starting point.
    # The script applies every event after it and replays a short backlog for the activity log.
    boot = {
        "id": str(session.pk),
        "snapshotSeq": session.last_event_seq,
        "backlogFrom": max(session.last_event_seq - EVENT_LOG_BACKLOG, 0),
        "status": session.status,
        "api": f"/api/v1/sessions/{session.pk}/",
        "ws": f"/ws/sessions/{session.pk}/",
        # The session API lists every tool the Session has; the card shows only the extra ones
        # (a MainSession's coordinator tool comes with its kind: not an extra either).
        "defaultTools": [
            *default_tool_names(),
            *([DELEGATE_TOOL] if session.kind == SessionKind.MAIN else []),
        ],
        # Whose Session it is: memories recalled for it are the owner's, private to them.
        "owner": session.owner.get_username() if session.owner_id else "",
        # A MainSession lists the sub-Sessions it handed tasks to (and follows their status).
        "kind": session.kind,
    }
    # The Goal run card starts from the run as `GET …/goal-run/` would answer (null: none, where
    # the route answers 404), and reads it again on the events that follow the snapshot.
    run = goal_driver.current_run(session.pk)
    boot["goalRun"] = GoalRunSerializer(run).data if run is not None else None
    # A sub-Session links to the MainSession that handed it its task (same tenant, not archived).
    parent = None
    if session.parent_id is not None:
        parent = (
            Session.objects.for_tenant(membership.tenant)
            .filter(pk=session.parent_id, archived_at__isnull=True)
            .only("pk", "title")
            .first()
        )
    goals = [
        {
            "field": "session_goal",
            "slug": "session-goal",
            "label": "Session goal",
            "value": session.session_goal,
            "help": "What this whole Session is for: set by its first task, changed only by people.",
        },
        {
            "field": "phase_goal",
            "slug": "phase-goal",
            "label": "Phase goal",
            "value": session.phase_goal,
            "help": "What the agent works on now: each new task or phase sets it, and you may correct it.",
        },
    ]
    return render(
        request,
        "workspace/session.html",
        {
            "session": session,
            "boot": boot,
            "parent": parent,
            "goals": goals,
            "goal_run_form": goal_run_form(),
        },
    )


def goal_run_form() -> list[dict]:
    """The Goal run card's fields, with the defaults and limits of `POST …/goal-run/` (its
    serializer owns them). The time budget is asked in hours:minutes; static/js converts it."""
    fields = GoalRunCreateSerializer().fields
    wall_clock = fields["wall_clock_seconds"]
    return [
        {
            "name": "goal",
            "label": "Goal",
            "max": fields["goal"].max_length,
            "help": "What should be true when the work is done. Each round sends it to the agent as a message.",
        },
        {
            "name": "max_rounds",
            "label": "Rounds",
            "value": fields["max_rounds"].default,
            "inputmode": "numeric",
            "help": f"At most {fields['max_rounds'].max_value}. The run stops after this many, even with work open.",
        },
        {
            "name": "token_budget",
            "label": "Token budget",
            "value": fields["token_budget"].default,
            "inputmode": "numeric",
            "help": "Prompt + completion tokens this Session may spend while the run is open.",
        },
        {
            "name": "wall_clock",
            "label": "Time budget",
            "value": _hours_minutes(wall_clock.default),
            "inputmode": "text",
            "help": f"Hours:minutes (1:30) or minutes (90), at most {_hours_minutes(wall_clock.max_value)}."
            " Paused time counts.",
        },
    ]


def _hours_minutes(seconds: int) -> str:
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}"


@login_required
def memories(request):
    """The user's own long-term memories in the current tenant (listed, filtered and deleted by
    static/js/memories.js through `/api/v1/memories/`, which scopes them to this user)."""
    return render(request, "workspace/memories.html", {"memory_kinds": MemoryKind.choices})


@login_required
def usage_page(request):
    """Tokens and cost of the current tenant's model calls over the last 30 days, drawn on the
    server (sessions_app/usage_charts.py): per day, per user and per model. Members see their
    own Sessions' usage, owners and admins everyone's — the rule `/api/v1/usage/` applies."""
    membership = resolve_membership(request.user, request.session.get(SESSION_TENANT_KEY))
    if membership is None:
        return render(request, "workspace/usage.html", {})
    user_id = None if membership.role in ADMIN_ROLES else request.user.pk
    days_shown = request.GET.get("days", "30")
    days_shown = int(days_shown) if days_shown in USAGE_PERIODS else 30
    within = usage.period(timezone.now() - timedelta(days=days_shown), None)
    currency = usage.currency()
    rules = [
        rule
        for rule in quotas.rules(membership.tenant_id)
        # A member sees the quotas that apply to them; admins every quota of the tenant.
        if user_id is None or rule.user_id in (None, user_id)
    ]
    names = dict(
        Membership.objects.for_tenant(membership.tenant_id)
        .filter(user_id__in=[rule.user_id for rule in rules if rule.user_id])
        .values_list("user_id", "user__username")
    )

    def totals(group_by):
        return usage.totals(membership.tenant_id, group_by, within, user_id=user_id)

    days, users, models = totals("day"), totals("user"), totals("model")
    return render(
        request,
        "workspace/usage.html",
        {
            "within": within,
            "currency": currency,
            "everyone": user_id is None,
            "total": {
                "prompt_tokens": sum(r["prompt_tokens"] for r in days),
                "completion_tokens": sum(r["completion_tokens"] for r in days),
                "cost": sum(r["cost"] for r in days),
                "calls": sum(r["calls"] for r in days),
            },
            "day_chart": usage_charts.daily(
                usage_charts.every_day(days, within.since.date(), within.until.date()), currency
            ),
            "user_chart": usage_charts.ranking(users, currency),
            "model_chart": usage_charts.ranking(models, currency),
            "days": days,
            "users": users,
            "models": models,
            "days_shown": days_shown,
            "periods": USAGE_PERIODS,
            "quotas": [
                {
                    "whose": names.get(rule.user_id, "?") if rule.user_id else "the whole organisation",
                    "period": rule.period,
                    "max_tokens": rule.max_tokens,
                    "max_cost": rule.max_cost,
                    "tokens": tokens,
                    "cost": cost,
                    "spent": (rule.max_tokens is not None and tokens >= rule.max_tokens)
                    or (rule.max_cost is not None and cost >= rule.max_cost),
                }
                for rule, tokens, cost in quotas.standing(membership.tenant_id, rules)
            ],
        },
    )
