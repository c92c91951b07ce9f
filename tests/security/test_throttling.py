"""Abuse limits: the API rate per key and per browser user (exact under concurrent callers),
login lockout (django-axes) and the bounded `/healthz?worker=1` ping."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.core.cache import cache
from django.db import connections
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from config import views
from tests.factories import PASSWORD
from tests.runtime.helpers import new_session
from tests.tenancy.isolation import assert_error_shape

pytestmark = pytest.mark.django_db

ME = "/api/v1/me/"


@pytest.fixture
def tiny_rate(settings):
    """Three calls a minute. The throttle reads its rate per request, so this applies at once."""
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"api_key": "3/min"}}


@pytest.fixture(autouse=True)
def fresh_counters():
    """Row ids repeat across tests (rolled back), so counters keyed by them must not."""
    keys = [views.WORKER_PING_LOCK_KEY, views.WORKER_LAST_RESULT_KEY]
    cache.delete_many(keys)
    yield
    cache.delete_many(keys)


def _clear_throttle(*idents):
    cache.delete_many([f"throttle_api_key_{ident}" for ident in idents])


class TestApiRate:
    def test_an_api_key_over_its_rate_gets_429_in_the_error_shape_with_retry_after(
        self, api_owner_a, api_member_a, owner_a, member_a, tiny_rate
    ):
        from tenancy_app.models import ApiKey

        _clear_throttle(*(f"key:{k.pk}" for k in ApiKey.objects.all()))
        answers = [api_owner_a.get(ME).status_code for _ in range(3)]

        refused = api_owner_a.get(ME)

        assert answers == [200, 200, 200]
        error = assert_error_shape(refused, 429, "throttled")
        assert "throttled" in error["message"].lower() or "expected" in error["message"].lower()
        assert int(refused["Retry-After"]) > 0
        assert api_member_a.get(ME).status_code == 200  # another key keeps its own budget

    def test_a_browser_user_has_one_budget_for_all_their_calls(self, member_a, tiny_rate):
        _clear_throttle(f"user:{member_a.pk}")
        first, second = APIClient(), APIClient()
        first.force_login(member_a)
        second.force_login(member_a)

        answers = [first.get(ME).status_code, second.get(ME).status_code, first.get(ME).status_code]

        assert answers == [200, 200, 200]
        assert_error_shape(second.get(ME), 429, "throttled")

    def test_a_user_with_many_keys_has_one_user_budget(self, owner_a, tenant_a, settings):
        from tests.factories import issue_key

        settings.REST_FRAMEWORK = {
            **settings.REST_FRAMEWORK,
            "DEFAULT_THROTTLE_RATES": {"api_key": "100/min", "user": "4/min"},
        }
        cache.delete(f"throttle_user_user:{owner_a.pk}")
        clients = []
        for n in range(3):
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {issue_key(tenant_a, owner_a, f'k{n}')[1]}")
            clients.append(client)

        answers = [clients[n % 3].get(ME).status_code for n in range(4)]

        assert answers == [200, 200, 200, 200]
        assert_error_shape(clients[2].get(ME), 429, "throttled")  # a fresh key, the same user

    def test_a_long_poll_counts_in_the_keys_rate(self, api_owner_a, tenant_a, owner_a, tiny_rate):
        from tenancy_app.models import ApiKey

        _clear_throttle(*(f"key:{k.pk}" for k in ApiKey.objects.all()))
        session = new_session(tenant_a, owner_a)
        url = f"/api/v1/sessions/{session.pk}/events/?after=0&wait=1"

        answers = [api_owner_a.get(url).status_code for _ in range(3)]

        assert answers == [200, 200, 200]
        assert_error_shape(api_owner_a.get(url), 429, "throttled")
        assert_error_shape(api_owner_a.get(ME), 429, "throttled")


def hammer(clients, path: str, calls_each: int) -> Counter:
    """Every client calls `path` `calls_each` times, all clients at once (one thread each,
    released together); the answers' status codes, counted."""
    start = threading.Barrier(len(clients))

    def calls(client):
        try:
            start.wait()
            return [client.get(path).status_code for _ in range(calls_each)]
        finally:
            connections.close_all()

    with ThreadPoolExecutor(len(clients)) as pool:
        return Counter(code for codes in pool.map(calls, clients) for code in codes)


def bearer(plaintext: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


@pytest.mark.django_db(transaction=True)
class TestConcurrentCallers:
    """DRF's own throttle reads and rewrites a history list: concurrent calls all read the same
    one and get through (about 1,300 a minute against 1,200/min from 8 clients). The count here
    is one atomic increment, so the rate holds exactly however many call at once."""

    CLIENTS, CALLS_EACH = 16, 4

    @pytest.fixture
    def rates(self, settings):
        def set_rates(**rates):
            settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}

        return set_rates

    def _keys(self, tenant, user, count):
        from tenancy_app.models import ApiKey
        from tests.factories import issue_key

        plaintexts = [issue_key(tenant, user, f"k{n}")[1] for n in range(count)]
        # Authentication records `last_used_at` on a key's first call; done here, the threads only read.
        ApiKey.objects.filter(user=user).update(last_used_at=timezone.now())
        # Ids repeat across test databases; a shared cache may still hold their counts.
        _clear_throttle(
            *(f"key:{pk}" for pk in ApiKey.objects.filter(user=user).values_list("pk", flat=True))
        )
        cache.delete(f"throttle_user_user:{user.pk}")
        return plaintexts

    def test_one_key_from_16_clients_at_once_gets_exactly_its_rate(self, owner_a, tenant_a, rates):
        rates(api_key="20/min", user="1000/min")
        (plaintext,) = self._keys(tenant_a, owner_a, 1)

        answers = hammer([bearer(plaintext) for _ in range(self.CLIENTS)], ME, self.CALLS_EACH)

        assert answers == {200: 20, 429: self.CLIENTS * self.CALLS_EACH - 20}

    def test_one_user_with_16_keys_at_once_gets_exactly_the_user_rate(self, owner_a, tenant_a, rates):
        rates(api_key="1000/min", user="20/min")
        plaintexts = self._keys(tenant_a, owner_a, self.CLIENTS)

        answers = hammer([bearer(p) for p in plaintexts], ME, self.CALLS_EACH)

        assert answers == {200: 20, 429: self.CLIENTS * self.CALLS_EACH - 20}

    def test_a_refused_call_says_when_the_window_ends(self, owner_a, tenant_a, rates):
        rates(api_key="20/min", user="1000/min")
        (plaintext,) = self._keys(tenant_a, owner_a, 1)
        hammer([bearer(plaintext) for _ in range(self.CLIENTS)], ME, 2)

        refused = bearer(plaintext).get(ME)

        assert_error_shape(refused, 429, "throttled")
        assert 0 < int(refused["Retry-After"]) <= 60

    @pytest.mark.services
    def test_the_production_cache_counts_exactly_too(self, owner_a, tenant_a, rates):
        """The same count on the backend production settings configure (Redis, shared by every
        web process), not just the in-process cache."""
        from django.core.cache import caches
        from django.core.cache.backends.redis import RedisCache

        assert isinstance(caches["default"], RedisCache)
        rates(api_key="20/min", user="1000/min")
        (plaintext,) = self._keys(tenant_a, owner_a, 1)

        answers = hammer([bearer(plaintext) for _ in range(self.CLIENTS)], ME, self.CALLS_EACH)

        assert answers == {200: 20, 429: self.CLIENTS * self.CALLS_EACH - 20}


class TestLoginLockout:
    def _attempt(self, client, password, url="/accounts/login/", username="owner_a"):
        return client.post(url, {"username": username, "password": password})

    def test_six_wrong_passwords_lock_the_seventh_attempt_even_with_the_right_one(self, owner_a):
        client = Client()
        wrong = [self._attempt(client, f"wrong-{n}") for n in range(6)]

        locked = self._attempt(client, PASSWORD)

        assert wrong[0].status_code == 200  # the form again, with its error
        assert locked.status_code == 429
        page = locked.content.decode()
        assert "Too many login attempts" in page and "owner_a" in page
        assert "minutes" in page
        assert "_auth_user_id" not in client.session

    def test_the_lockout_is_per_username_and_address(self, owner_a, member_a):
        client = Client()
        for n in range(6):
            self._attempt(client, f"wrong-{n}")

        other_user = self._attempt(Client(), PASSWORD, username="member_a")
        other_address = Client(REMOTE_ADDR="10.1.2.3")
        from_elsewhere = self._attempt(other_address, PASSWORD)

        assert other_user.status_code == 302
        assert from_elsewhere.status_code == 302 and "_auth_user_id" in other_address.session

    def test_the_admin_login_shows_the_same_lockout_page(self, owner_a):
        client = Client()
        for n in range(6):
            self._attempt(client, f"wrong-{n}", url="/admin/login/")

        locked = self._attempt(client, PASSWORD, url="/admin/login/")

        assert locked.status_code == 429
        assert "Too many login attempts" in locked.content.decode()

    def test_fewer_failures_than_the_limit_do_not_lock(self, owner_a, settings):
        client = Client()
        for n in range(settings.AXES_FAILURE_LIMIT - 1):
            self._attempt(client, f"wrong-{n}")

        assert self._attempt(client, PASSWORD).status_code == 302


class TestHealthzWorkerPing:
    @pytest.fixture
    def pings(self, monkeypatch):
        sent = []

        def fake_check():
            sent.append(1)
            return "ok"

        monkeypatch.setattr(views, "_check_worker", fake_check)
        return sent

    def test_anonymous_callers_share_one_real_ping_per_interval(self, pings):
        answers = [Client().get("/healthz?worker=1") for _ in range(3)]

        assert len(pings) == 1
        assert [a.status_code for a in answers] == [200, 200, 200]
        assert "worker_checked_s_ago" not in answers[0].json()
        later = answers[2].json()
        assert later["worker"] == "ok" and 0 <= later["worker_checked_s_ago"] < 60

    def test_a_new_ping_goes_out_once_the_interval_has_passed(self, pings):
        Client().get("/healthz?worker=1")
        cache.delete(views.WORKER_PING_LOCK_KEY)  # what the cache does after the interval

        Client().get("/healthz?worker=1")

        assert len(pings) == 2

    def test_a_cached_failure_is_reported_with_a_503(self, monkeypatch):
        monkeypatch.setattr(views, "_check_worker", lambda: "error: no worker answered within 5 s")
        Client().get("/healthz?worker=1")

        response = Client().get("/healthz?worker=1")

        assert response.status_code == 503
        assert response.json()["worker"].startswith("error:")
        assert "worker_checked_s_ago" in response.json()

    def test_while_the_first_ping_is_on_its_way_others_get_pending(self, pings):
        cache.add(views.WORKER_PING_LOCK_KEY, 1, timeout=10)  # another request is pinging

        response = Client().get("/healthz?worker=1")

        assert response.status_code == 503 and response.json()["worker"].startswith("pending")
        assert pings == []

    def test_staff_always_ping(self, pings, owner_a):
        client = Client()
        client.force_login(owner_a)  # tenant owners are staff

        answers = [client.get("/healthz?worker=1").json() for _ in range(3)]

        assert len(pings) == 3
        assert all(a["worker"] == "ok" and "worker_checked_s_ago" not in a for a in answers)

    def test_without_worker_no_ping_is_sent(self, pings):
        assert Client().get("/healthz").json() == {"status": "ok", "database": "ok", "broker": "ok"}
        assert pings == []
