"""Who sees an approval: one query filter (`approvals.visible_to`) behind the tenant list, the
detail and decide routes and a Session's sub-list. An approval missing from a person's list is a
404 on its own routes — never a 403 that confirms it exists.

Personas: owner_a (tenant owner: sees all of A), member_a (a member), member_a2 (another
member), outsider_b (tenant B)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals_app.models import PendingApproval
from approvals_app.policy_models import default_deciders
from sessions_app.runtime import approvals
from tenancy_app.choices import Role
from tenancy_app.models import Membership
from tests.factories import make_member
from tests.runtime.helpers import new_session
from tests.support.ws import CONNECT_TIMEOUT_S
from tests.tenancy.isolation import assert_error_shape

pytestmark = pytest.mark.django_db

MEMBERS_DECIDE = {"session_owner": True, "tenant_admins": True, "roles": ["member"]}


def make_approval(session, tool="fs_delete_files", deciders=None):
    return PendingApproval.objects.create(
        tenant_id=session.tenant_id,
        session_id=session.pk,
        turn_id=1,
        assistant_message_id=1,
        call_id=f"call-{tool}",
        tool=tool,
        arguments={"paths": ["customers.csv"]},
        arguments_redacted={"paths": ["customers.csv"]},
        risk="destructive",
        reason="Destructive action: a person must approve it.",
        deciders=default_deciders() if deciders is None else deciders,
        requested_by_id=session.owner_id,
    )


@pytest.fixture
def member_a2(tenant_a):
    return make_member(tenant_a, "member_a2", Role.MEMBER)


@pytest.fixture
def owners_approval(tenant_a, owner_a):
    """On owner_a's Session; member_a neither owns it nor may decide it."""
    return make_approval(new_session(tenant_a, owner_a, title="Owner's cleanup"))


@pytest.fixture
def members_approval(tenant_a, member_a):
    return make_approval(new_session(tenant_a, member_a, title="Member's cleanup"), tool="fs_write")


def ids(response):
    assert response.status_code == 200, response.content[:300]
    body = response.json()
    rows = body["results"] if isinstance(body, dict) else body  # paginated or a plain list
    return [row["id"] for row in rows]


class TestAMemberWhoMayNotSeeIt:
    def test_it_is_absent_from_the_tenant_list(self, api_member_a, owners_approval, members_approval):
        assert ids(api_member_a.get("/api/v1/approvals/")) == [members_approval.pk]
        assert ids(api_member_a.get("/api/v1/approvals/?status=pending")) == [members_approval.pk]

    def test_its_detail_is_404(self, api_member_a, owners_approval):
        response = api_member_a.get(f"/api/v1/approvals/{owners_approval.pk}/")

        error = assert_error_shape(response, 404, "not_found")
        assert "fs_delete_files" not in str(error)

    def test_deciding_it_is_404_and_changes_nothing(self, api_member_a, owners_approval):
        response = api_member_a.post(
            f"/api/v1/approvals/{owners_approval.pk}/decide/", {"decision": "approve"}, format="json"
        )

        assert_error_shape(response, 404, "not_found")
        owners_approval.refresh_from_db()
        assert owners_approval.status == "pending" and owners_approval.decided_by is None

    def test_it_is_absent_from_the_sessions_sub_list(self, api_member_a, owners_approval):
        response = api_member_a.get(f"/api/v1/sessions/{owners_approval.session_id}/approvals/")

        # Whether the Session itself is visible to a member is the Session API's call; either way
        # the approval does not show.
        if response.status_code == 404:
            assert_error_shape(response, 404, "not_found")
        else:
            assert ids(response) == []


class TestWhoSeesIt:
    def test_the_tenant_owner_sees_every_approval_of_the_tenant(
        self, api_owner_a, owners_approval, members_approval
    ):
        assert sorted(ids(api_owner_a.get("/api/v1/approvals/"))) == sorted(
            [owners_approval.pk, members_approval.pk]
        )
        assert api_owner_a.get(f"/api/v1/approvals/{members_approval.pk}/").status_code == 200
        sub_list = api_owner_a.get(f"/api/v1/sessions/{members_approval.session_id}/approvals/")
        assert ids(sub_list) == [members_approval.pk]

    def test_a_member_sees_and_decides_their_own_sessions_approval(self, api_member_a, members_approval):
        assert api_member_a.get(f"/api/v1/approvals/{members_approval.pk}/").json()["tool"] == "fs_write"
        sub_list = api_member_a.get(f"/api/v1/sessions/{members_approval.session_id}/approvals/")
        assert ids(sub_list) == [members_approval.pk]

        decided = api_member_a.post(
            f"/api/v1/approvals/{members_approval.pk}/decide/", {"decision": "reject"}, format="json"
        )

        assert decided.status_code == 200 and decided.json()["status"] == "rejected"

    def test_a_member_named_by_role_sees_and_decides_it(self, tenant_a, owner_a, api_member_a):
        approval = make_approval(new_session(tenant_a, owner_a), deciders=MEMBERS_DECIDE)

        assert ids(api_member_a.get("/api/v1/approvals/")) == [approval.pk]
        assert api_member_a.get(f"/api/v1/approvals/{approval.pk}/").status_code == 200
        decided = api_member_a.post(
            f"/api/v1/approvals/{approval.pk}/decide/", {"decision": "approve"}, format="json"
        )
        assert decided.status_code == 200 and decided.json()["decided_by"] == "member_a"

    def test_a_session_owner_who_may_not_decide_sees_it_but_gets_403(self, tenant_a, member_a, api_member_a):
        # The rule left the Session owner out of the deciders: visible (their Session), not decidable.
        approval = make_approval(
            new_session(tenant_a, member_a), deciders={"session_owner": False, "tenant_admins": True}
        )

        assert api_member_a.get(f"/api/v1/approvals/{approval.pk}/").status_code == 200
        response = api_member_a.post(
            f"/api/v1/approvals/{approval.pk}/decide/", {"decision": "approve"}, format="json"
        )
        assert_error_shape(response, 403, "permission_denied")

    def test_another_member_does_not_see_a_members_session_approval(
        self, member_a2, tenant_a, members_approval
    ):
        from tests.conftest import _client_with_key

        client = _client_with_key(member_a2, tenant_a)

        assert ids(client.get("/api/v1/approvals/")) == []
        assert_error_shape(client.get(f"/api/v1/approvals/{members_approval.pk}/"), 404, "not_found")

    def test_another_tenant_sees_nothing(self, api_outsider_b, owners_approval, members_approval):
        assert ids(api_outsider_b.get("/api/v1/approvals/")) == []
        for approval in (owners_approval, members_approval):
            assert_error_shape(api_outsider_b.get(f"/api/v1/approvals/{approval.pk}/"), 404, "not_found")


class TestOneQueryFilter:
    def test_the_list_costs_the_same_for_one_or_many_approvals(self, tenant_a, owner_a, api_member_a):
        session = new_session(tenant_a, owner_a)
        make_approval(session, deciders=MEMBERS_DECIDE)
        api_member_a.get("/api/v1/approvals/")  # first use of the key writes its last-used time
        with CaptureQueriesContext(connection) as one:
            assert len(ids(api_member_a.get("/api/v1/approvals/"))) == 1
        for number in range(6):
            make_approval(session, tool=f"tool_{number}", deciders=MEMBERS_DECIDE if number % 2 else None)
        with CaptureQueriesContext(connection) as many:
            assert len(ids(api_member_a.get("/api/v1/approvals/"))) == 4

        assert len(many) == len(one)

    @pytest.mark.parametrize(
        "deciders",
        [
            None,
            MEMBERS_DECIDE,
            {"session_owner": False, "tenant_admins": True},
            {"roles": ["admin", "member"]},
        ],
        ids=["default", "members", "admins-only", "roles"],
    )
    def test_everyone_who_may_decide_may_see(self, tenant_a, owner_a, member_a, member_a2, deciders):
        approval = make_approval(new_session(tenant_a, member_a), deciders=deciders)

        for user in (owner_a, member_a, member_a2):
            membership = Membership.objects.get(tenant=tenant_a, user=user)
            visible = approvals.visible_to(PendingApproval.objects.all(), user, membership).exists()
            if approvals.may_decide(approval, user):
                assert visible, user.username
            assert visible == approvals.may_see(approval, user)

    def test_no_membership_sees_nothing(self, owner_a, owners_approval):
        assert not approvals.visible_to(PendingApproval.objects.all(), owner_a, None).exists()


@pytest.mark.django_db(transaction=True)
class TestTheWebSocketDecideFrame:
    """The `decide` frame uses the same filter: an approval the person cannot see is `not_found`."""

    async def test_a_member_who_may_not_see_it_gets_not_found_and_nothing_changes(
        self, tenant_a, member_a, owners_approval
    ):
        from channels.db import database_sync_to_async
        from channels.testing import WebsocketCommunicator

        from config.asgi import application
        from tests.factories import issue_key

        _, plaintext = await database_sync_to_async(issue_key)(tenant_a, member_a, "ws")
        communicator = WebsocketCommunicator(
            application, f"/ws/sessions/{owners_approval.session_id}/?token={plaintext}&after=999999"
        )
        connected, _ = await communicator.connect(timeout=CONNECT_TIMEOUT_S)
        assert connected
        await communicator.send_json_to(
            {"type": "decide", "approval_id": owners_approval.pk, "decision": "approve"}
        )
        while True:
            frame = await communicator.receive_json_from(timeout=5)
            if frame["type"] in ("error", "ack"):
                break
        await communicator.disconnect()

        assert frame["type"] == "error" and frame["error"]["code"] == "not_found", frame
        refreshed = await database_sync_to_async(PendingApproval.objects.get)(pk=owners_approval.pk)
        assert refreshed.status == "pending"
