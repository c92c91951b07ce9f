"""Goals in admin: a tenant admin edits a Session's goals explicitly (through SessionEngine, as
the API's PATCH does: announced with `goals.updated`); another tenant's Session is a 404, and a
member without admin rights cannot reach it."""

from __future__ import annotations

from django.test import Client

from sessions_app.models import Session, SessionEvent
from sessions_app.runtime import engine


def test_a_tenant_admin_edits_goals_of_their_tenants_sessions_only(
    owner_a, member_a, outsider_b, tenant_a, tenant_b
):
    mine = engine.create_session(tenant=tenant_a, owner=member_a, title="mine", goal="Old goal")
    theirs = engine.create_session(
        tenant=tenant_b, owner=outsider_b, title="theirs", goal="Bravo secret goal"
    )
    client = Client()
    client.force_login(owner_a)

    change = client.get(f"/admin/sessions_app/session/{mine.pk}/change/")
    assert (
        change.status_code == 200
        and f"/admin/sessions_app/session/{mine.pk}/goals/" in change.content.decode()
    )
    form = client.get(f"/admin/sessions_app/session/{mine.pk}/goals/")
    assert form.status_code == 200 and "Old goal" in form.content.decode()
    saved = client.post(
        f"/admin/sessions_app/session/{mine.pk}/goals/",
        {"session_goal": "New goal", "phase_goal": "Phase one"},
    )
    assert saved.status_code == 302
    mine.refresh_from_db()
    assert (mine.session_goal, mine.phase_goal) == ("New goal", "Phase one")
    (event,) = SessionEvent.objects.filter(session=mine, type="goals.updated")
    assert event.data["by"] == owner_a.username

    too_long = client.post(f"/admin/sessions_app/session/{mine.pk}/goals/", {"phase_goal": "x" * 10001})
    assert too_long.status_code == 200 and "errorlist" in too_long.content.decode()

    # Another tenant's Session does not exist here.
    assert client.get(f"/admin/sessions_app/session/{theirs.pk}/goals/").status_code == 404
    assert (
        client.post(f"/admin/sessions_app/session/{theirs.pk}/goals/", {"phase_goal": "pwned"}).status_code
        == 404
    )
    assert Session.objects.get(pk=theirs.pk).phase_goal == ""

    # A plain member has no admin.
    member = Client()
    member.force_login(member_a)
    assert member.get(f"/admin/sessions_app/session/{mine.pk}/goals/").status_code in (302, 403)
