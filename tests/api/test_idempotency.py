"""`Idempotency-Key` on `POST /sessions/{id}/inputs/` belongs to its caller (issue #25): the API
key when the call used one, else the user. The same caller repeating gets its first input
back (200, nothing queued twice); anyone else reusing the key string sends their own input
(202) and never receives someone else's."""

import pytest
from rest_framework.test import APIClient

from sessions_app.models import Input, SessionEvent
from tests.runtime.helpers import new_session

from ..factories import issue_key

pytestmark = pytest.mark.django_db

KEY = "retry-safe-1"


@pytest.fixture
def session_a(tenant_a, owner_a):
    return new_session(tenant_a, owner_a, title="shared")


def post_input(client, session, text: str, key: str | None = KEY):
    headers = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    return client.post(f"/api/v1/sessions/{session.pk}/inputs/", {"text": text}, format="json", **headers)


def queued_input_ids(session) -> list[int]:
    return [e.data["input_id"] for e in SessionEvent.objects.filter(session=session, type="input.queued")]


def browser(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def test_the_same_key_repeated_gets_its_own_first_input_and_queues_nothing(api_owner_a, session_a):
    first = post_input(api_owner_a, session_a, "hello")

    again = post_input(api_owner_a, session_a, "hello")

    assert first.status_code == 202 and again.status_code == 200
    assert again.json() == first.json()
    assert queued_input_ids(session_a) == [first.json()["input_id"]]


def test_a_colleague_reusing_the_key_sends_their_own_input(api_owner_a, api_member_a, session_a):
    mine = post_input(api_owner_a, session_a, "owner's request")

    theirs = post_input(api_member_a, session_a, "colleague's request")

    assert theirs.status_code == 202
    assert theirs.json()["input_id"] != mine.json()["input_id"]
    assert Input.objects.get(pk=theirs.json()["input_id"]).payload["text"] == "colleague's request"
    assert Input.objects.get(pk=mine.json()["input_id"]).payload["text"] == "owner's request"
    assert queued_input_ids(session_a) == [mine.json()["input_id"], theirs.json()["input_id"]]
    # Each repeats its own retry safely.
    assert post_input(api_member_a, session_a, "colleague's request").json() == theirs.json()
    assert post_input(api_owner_a, session_a, "owner's request").json() == mine.json()
    assert Input.objects.filter(session=session_a).count() == 2


def test_two_keys_of_one_user_are_two_callers(owner_a, tenant_a, session_a):
    clients = []
    for name in ("ci", "cron"):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {issue_key(tenant_a, owner_a, name)[1]}")
        clients.append(client)

    answers = [post_input(client, session_a, f"from {n}") for n, client in enumerate(clients)]

    assert [a.status_code for a in answers] == [202, 202]
    assert len({a.json()["input_id"] for a in answers}) == 2


def test_the_browser_session_is_the_users_own_caller(api_owner_a, owner_a, member_a, session_a):
    by_key = post_input(api_owner_a, session_a, "scripted")
    first = post_input(browser(owner_a), session_a, "typed")
    repeated = post_input(browser(owner_a), session_a, "typed")  # another tab of the same user
    colleague = post_input(browser(member_a), session_a, "typed too")

    assert (first.status_code, repeated.status_code, colleague.status_code) == (202, 200, 202)
    assert repeated.json() == first.json()
    assert len({by_key.json()["input_id"], first.json()["input_id"], colleague.json()["input_id"]}) == 3


def test_the_caller_is_recorded_with_the_input(api_owner_a, owner_a, session_a):
    from tenancy_app.models import ApiKey

    by_key = post_input(api_owner_a, session_a, "scripted")
    by_browser = post_input(browser(owner_a), session_a, "typed", key=None)

    key = ApiKey.objects.get(user=owner_a)
    assert Input.objects.get(pk=by_key.json()["input_id"]).caller == f"key:{key.pk}"
    assert Input.objects.get(pk=by_browser.json()["input_id"]).caller == f"user:{owner_a.pk}"


def test_inputs_without_a_key_are_never_taken_for_repeats(api_owner_a, session_a):
    answers = [post_input(api_owner_a, session_a, "same text", key=None) for _ in range(2)]

    assert [a.status_code for a in answers] == [202, 202]
    assert answers[0].json()["input_id"] != answers[1].json()["input_id"]
