"""Issue #11, in-process: who holds a lease and whether it is gone (presence), what the sweep
wakes, and the recovery rules a runner applies when it takes over from a lost one. The model is
the scripted server; everything else is the real runtime on the test database."""

import json
import os
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals_app.models import ApprovalPolicy, ApprovalRule, PendingApproval
from sessions_app.models import Message, Session, SessionEvent, Turn, WorkerPresence
from sessions_app.runtime import brain, engine, presence
from tests.support.model_server import text_reply

from .helpers import assert_gap_free, assert_tool_pairs, commit_calls, drive_until_idle, new_session, send


def _row(holder, *, seen_ago=0.0, started_ago=60.0):
    host, pid, _ = presence.parse_holder(holder)
    now = timezone.now()
    return WorkerPresence.objects.create(
        holder=holder,
        host=host,
        pid=pid,
        started_at=now - timedelta(seconds=started_ago),
        seen_at=now - timedelta(seconds=seen_ago),
    )


def _exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: the pid is free
    return proc.pid


@pytest.fixture
def live_child():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


# --- presence: is a lease holder gone? -----------------------------------------------------------


class TestGoneHolders:
    def test_a_fresh_holder_whose_process_lives_is_not_gone(self, db, live_child):
        holder = f"{presence.local_host()}:{live_child.pid}:aaaa"
        _row(holder)
        assert presence.gone_holders({holder}) == set()

    def test_a_holder_on_this_host_whose_pid_is_dead_is_gone_at_once(self, db):
        holder = f"{presence.local_host()}:{_exited_pid()}:bbbb"
        _row(holder)  # its last beat was just now: only the pid tells
        assert presence.gone_holders({holder}) == {holder}

    def test_a_holder_not_seen_for_the_timeout_is_gone_wherever_it_ran(self, db, settings):
        settings.XAGENT_PRESENCE_TIMEOUT_SECONDS = 10
        stale, fresh = "elsewhere/1:100:cccc", "elsewhere/1:101:dddd"
        _row(stale, seen_ago=11)
        _row(fresh, seen_ago=2)
        assert presence.gone_holders({stale, fresh}) == {stale}

    def test_a_holder_without_a_presence_row_is_gone(self, db):
        assert presence.gone_holders({"elsewhere/1:100:eeee"}) == {"elsewhere/1:100:eeee"}

    def test_a_pid_reused_by_a_newer_process_of_ours_means_the_old_holder_is_gone(self, db, live_child):
        old = f"{presence.local_host()}:{live_child.pid}:0001"
        new = f"{presence.local_host()}:{live_child.pid}:0002"
        _row(old, started_ago=120)
        _row(new, started_ago=5)
        assert presence.gone_holders({old, new}) == {old}

    def test_this_process_under_another_nonce_is_a_previous_life_of_it(self, db):
        mine = presence.holder_id()
        host, pid, _ = presence.parse_holder(mine)
        before = f"{host}:{pid}:ffff"
        _row(before)
        presence.beat()
        assert presence.gone_holders({before, mine}) == {before}

    def test_beat_keeps_one_row_per_process_fresh(self, db):
        presence.beat()
        first = WorkerPresence.objects.get(holder=presence.holder_id()).seen_at
        presence.beat()
        row = WorkerPresence.objects.get(holder=presence.holder_id())
        assert row.seen_at >= first and row.pid == os.getpid()
        assert WorkerPresence.objects.count() == 1

    def test_a_process_is_present_as_soon_as_it_may_claim_a_lease(self, transactional_db, settings):
        """`ensure_started` (worker start, a process's first slice) returns only once this
        process's row is written: a sweep between the claim and the thread's first beat would
        otherwise judge the new holder gone and expire its lease."""
        settings.XAGENT_PRESENCE_BEAT_SECONDS = 3600  # the thread beats once, then sleeps
        try:
            presence.ensure_started()
            assert presence.gone_holders({presence.holder_id()}) == set()
        finally:
            presence.stop_presence()
        assert not WorkerPresence.objects.exists()

    def test_the_first_beat_gives_its_pooled_connection_back(self, transactional_db, settings):
        """A Celery worker's main thread writes the first beat (`worker_ready`) and never ends a
        task, so nothing else returns its connection: it held one of the process's two pooled
        connections for good, and at 1,000 Sessions the runners starved on the other one."""
        from django.db import connection

        if not connection.settings_dict.get("OPTIONS", {}).get("pool"):
            pytest.skip("connections are pooled on PostgreSQL only")
        settings.XAGENT_PRESENCE_BEAT_SECONDS = 3600
        held_after = []

        def worker_main_thread():
            from django.db import connection as this_threads

            presence.ensure_started()
            held_after.append(this_threads.connection is not None)

        thread = threading.Thread(target=worker_main_thread)
        try:
            thread.start()
            thread.join(timeout=30)
            assert held_after == [False]
            assert presence.gone_holders({presence.holder_id()}) == set()  # the row was written
        finally:
            presence.stop_presence()

    def test_rows_of_processes_gone_for_long_are_pruned(self, db):
        _row("elsewhere/1:7:old0", seen_ago=presence.FORGET_AFTER.total_seconds() + 60)
        _row("elsewhere/1:8:new0", seen_ago=30)
        assert presence.prune() == 1
        assert list(WorkerPresence.objects.values_list("holder", flat=True)) == ["elsewhere/1:8:new0"]


class TestPresenceAdmin:
    URL = "/admin/sessions_app/workerpresence/"

    def test_only_superusers_see_it_and_nobody_edits_it(self, db, owner_a):
        from django.test import Client

        from tests.factories import UserFactory

        _row("elsewhere/1:9:abcd")
        tenant_admin, root = Client(), Client()
        tenant_admin.force_login(owner_a)  # staff owner of tenant A, not a superuser
        root.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))

        assert tenant_admin.get(self.URL).status_code == 403
        listing = root.get(self.URL)
        assert listing.status_code == 200 and b"elsewhere/1:9:abcd" in listing.content
        assert root.get(f"{self.URL}add/").status_code == 403
        row = WorkerPresence.objects.get()
        assert root.post(f"{self.URL}{row.pk}/change/", {"pid": 1}).status_code == 403
        assert WorkerPresence.objects.get().pid == 9

    def test_the_tenant_admin_edits_auto_resume(self, tenant_a, owner_a):
        from django.test import Client

        client = Client()
        client.force_login(owner_a)
        form = client.get(f"/admin/tenancy_app/tenant/{tenant_a.pk}/change/")
        assert b'name="auto_resume_after_recovery"' in form.content
        response = client.post(
            f"/admin/tenancy_app/tenant/{tenant_a.pk}/change/", {"name": tenant_a.name}
        )  # an unticked checkbox is simply absent from the form
        assert response.status_code == 302
        tenant_a.refresh_from_db()
        assert tenant_a.auto_resume_after_recovery is False


# --- the sweep ---------------------------------------------------------------------------------------


def _lose_runner(session):
    """The worker dies: its lease is still there, and lapses (or a sweep expired it)."""
    Session.objects.filter(pk=session.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def _leased(session, holder, *, expires_in=600):
    token = brain.acquire(session.pk)
    Session.objects.filter(pk=session.pk).update(
        runner_holder=holder, lease_expires_at=timezone.now() + timedelta(seconds=expires_in)
    )
    return token


class TestSweep:
    def test_it_expires_only_the_leases_of_gone_holders(self, tenant_a, owner_a, live_child):
        alive = f"{presence.local_host()}:{live_child.pid}:1111"
        dead = f"{presence.local_host()}:{_exited_pid()}:2222"
        _row(alive)
        _row(dead)
        kept, lost = new_session(tenant_a, owner_a), new_session(tenant_a, owner_a)
        kept_token, lost_token = _leased(kept, alive), _leased(lost, dead)

        assert brain.recover_stale_sessions() == 1

        kept.refresh_from_db()
        lost.refresh_from_db()
        assert kept.runner_token == kept_token and kept.lease_expires_at > timezone.now()
        # The token stays: the next claim sees a lapsed lease and takes over (took_over=True).
        assert lost.runner_token == lost_token and lost.lease_expires_at <= timezone.now()
        assert brain.claim(lost.pk)[1] is True
        assert brain.claim(kept.pk) == (None, False)

    def test_a_lease_that_changed_hands_meanwhile_is_left_alone(self, tenant_a, owner_a):
        session = new_session(tenant_a, owner_a)
        old_token = _leased(session, "elsewhere/1:5:dead")
        # Another runner took over between the sweep's read and its write (the lease lapsed).
        _lose_runner(session)
        new_token, took_over = brain.claim(session.pk)
        assert took_over and new_token != old_token

        assert brain.expire_lease(session.pk, old_token, "elsewhere/1:5:dead") is False
        assert Session.objects.get(pk=session.pk).lease_expires_at > timezone.now()

    def test_idle_sessions_are_not_woken_and_the_sweep_stays_cheap(
        self, tenant_a, owner_a, django_assert_max_num_queries
    ):
        idle = new_session(tenant_a, owner_a)
        waiting = new_session(tenant_a, owner_a)
        send(waiting, "later")  # a message behind a parked turn waits for the turn's end
        token = brain.acquire(waiting.pk)
        engine.start_turn(waiting.pk, token, engine.queued_inputs(waiting.pk).first())
        send(waiting, "queued behind the approval")
        with engine.locked_session(waiting.pk, token) as locked:
            engine.set_status(locked, "waiting_approval")
        brain.release(waiting.pk, token)
        assert idle.runner_token is None

        with django_assert_max_num_queries(3):
            assert brain.recover_stale_sessions() == 0

    def test_sessions_with_work_and_no_runner_are_woken(self, tenant_a, owner_a):
        session = new_session(tenant_a, owner_a)
        send(session, "hello")  # committed, but its wake was lost with a worker
        assert brain.recover_stale_sessions() == 1


# --- recovery rules at takeover ----------------------------------------------------------------


def _turn_with_calls(session, calls, text="go"):
    send(session, text)
    token = brain.acquire(session.pk)
    turn = engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    commit_calls(session, token, turn, calls)
    return token, turn


def _call(call_id, name, **arguments):
    return {"id": call_id, "name": name, "arguments": json.dumps(arguments)}


def _recovered(session):
    return SessionEvent.objects.get(session=session, type="session.recovered").data


def test_a_read_only_call_left_without_a_result_runs_again(tenant_a, owner_a, model_config_a, model_server):
    session = new_session(tenant_a, owner_a)
    (engine.workspace_path(session) / "notes.txt").write_text("the answer is 42")
    _turn_with_calls(session, [_call("r1", "fs_read", path="notes.txt")])
    _lose_runner(session)
    model_server.script("agent", text_reply("It says 42."))

    drive_until_idle(session)

    result = Message.objects.get(session=session, role="tool", tool_call_id="r1")
    assert not result.is_error and "the answer is 42" in result.content
    assert Turn.objects.get(session=session).reason == "completed"
    recovered = _recovered(session)
    assert recovered["rerun_calls"] == [{"call_id": "r1", "tool": "fs_read"}]
    assert recovered["interrupted_calls"] == []
    assert recovered["restored"] == ["turn 1 after 0 steps", "re-running read-only call fs_read (r1)"]
    assert recovered["next"] == "the calls left run, then the turn continues with step 1"
    request = model_server.requests_for("agent")[0]
    assert request.messages[-1]["tool_call_id"] == "r1"
    assert_tool_pairs(session)
    assert_gap_free(session)


def test_results_stay_in_model_order_around_an_interrupted_call(
    tenant_a, owner_a, model_config_a, model_server
):
    session = new_session(tenant_a, owner_a)
    (engine.workspace_path(session) / "a.txt").write_text("alpha")
    calls = [
        _call("e1", "fs_edit", path="a.txt", old_text="alpha", new_text="beta"),  # not idempotent
        _call("r2", "fs_read", path="a.txt"),
        _call("w3", "fs_write", path="b.txt", content="bee"),  # had not started: runs after r2
    ]
    _turn_with_calls(session, calls)
    _lose_runner(session)
    model_server.script("agent", text_reply("ok"))

    drive_until_idle(session)

    assert_tool_pairs(session)
    results = {m.tool_call_id: m for m in Message.objects.filter(session=session, role="tool")}
    assert results["e1"].is_error and results["e1"].content.startswith("Interrupted:")
    assert (engine.workspace_path(session) / "a.txt").read_text() == "alpha"  # e1 never ran
    assert not results["r2"].is_error and not results["w3"].is_error
    assert (engine.workspace_path(session) / "b.txt").read_text() == "bee"
    recovered = _recovered(session)
    assert [c["call_id"] for c in recovered["interrupted_calls"]] == ["e1"]
    assert recovered["rerun_calls"] == [{"call_id": "r2", "tool": "fs_read"}]
    assert "call fs_write (w3) had not started; it runs after them" in recovered["restored"]


def test_calls_after_an_interrupted_call_are_not_run(tenant_a, owner_a, model_config_a, model_server):
    session = new_session(tenant_a, owner_a)
    (engine.workspace_path(session) / "a.txt").write_text("alpha")
    calls = [
        _call("e1", "fs_edit", path="a.txt", old_text="alpha", new_text="beta"),
        _call("e2", "fs_edit", path="a.txt", old_text="beta", new_text="gamma"),
    ]
    _turn_with_calls(session, calls)
    _lose_runner(session)
    model_server.script("agent", text_reply("I will look first."))

    drive_until_idle(session)

    assert (engine.workspace_path(session) / "a.txt").read_text() == "alpha"
    assert [c["reason"] for c in _recovered(session)["interrupted_calls"]] == [
        "runner lost before its result",
        "not started: an earlier call of the same response was interrupted",
    ]
    assert_tool_pairs(session)


def test_a_read_only_call_that_needs_approval_waits_for_it_again(
    tenant_a, owner_a, model_config_a, model_server
):
    session = new_session(tenant_a, owner_a)
    policy = ApprovalPolicy.objects.create(tenant=tenant_a, name="careful", priority=1)
    ApprovalRule.objects.create(tenant=tenant_a, policy=policy, tool_glob="fs_read", reason="ask first")
    (engine.workspace_path(session) / "secret.txt").write_text("x")
    _turn_with_calls(session, [_call("r1", "fs_read", path="secret.txt")])
    _lose_runner(session)

    drive_until_idle(session)

    session.refresh_from_db()
    assert session.status == "waiting_approval"
    assert PendingApproval.objects.get(session_id=session.pk).call_id == "r1"
    assert not Message.objects.filter(session=session, role="tool").exists()
    assert model_server.requests_for("agent") == []


def test_auto_resume_off_closes_the_turn_and_keeps_the_queued_message(
    tenant_a, owner_a, model_config_a, model_server
):
    tenant_a.auto_resume_after_recovery = False
    tenant_a.save()
    session = new_session(tenant_a, owner_a)
    (engine.workspace_path(session) / "notes.txt").write_text("n")
    _, turn = _turn_with_calls(session, [_call("r1", "fs_read", path="notes.txt")])
    send(session, "and then this")  # queued while the runner was lost
    _lose_runner(session)
    model_server.script("agent", text_reply("Done with the second request."))

    drive_until_idle(session)

    first, second = Turn.objects.filter(session=session).order_by("number")
    assert first.pk == turn.pk and first.reason == "interrupted"
    assert "auto-continue after recovery is off" in first.reason_detail
    closed = Message.objects.get(session=session, role="tool", tool_call_id="r1")
    assert closed.is_error  # not re-run: the turn is over
    assert second.reason == "completed"
    assert Message.objects.filter(turn=second, role="user").get().content == "and then this"
    recovered = _recovered(session)
    assert (
        recovered["next"]
        == "the turn was closed: auto-continue is off; the next queued message starts a new turn"
    )
    assert recovered["rerun_calls"] == [] and "1 queued input" in recovered["restored"]
    assert len(model_server.requests_for("agent")) == 1
    assert_tool_pairs(session)


def test_a_busy_status_without_a_turn_fails_with_an_error_event(tenant_a, owner_a):
    session = new_session(tenant_a, owner_a)
    token = brain.acquire(session.pk)
    with engine.locked_session(session.pk, token) as locked:
        engine.set_status(locked, "running")  # the turn it belonged to is gone
    _lose_runner(session)

    drive_until_idle(session)

    session.refresh_from_db()
    assert session.status == "failed" and "no turn was open" in session.status_reason
    error = SessionEvent.objects.get(session=session, type="error")
    assert error.data["code"] == "recovery_failed" and "no turn was open" in error.data["message"]
    assert _recovered(session)["next"].startswith("nothing to resume")


def test_a_busy_status_without_a_turn_and_no_runner_is_swept_and_failed(tenant_a, owner_a):
    session = new_session(tenant_a, owner_a)
    with engine.locked_session(session.pk) as locked:
        engine.set_status(locked, "preparing")

    assert brain.recover_stale_sessions() == 1  # it looks busy: the sweep wakes it
    drive_until_idle(session)

    assert session.status == "failed"
    assert (
        SessionEvent.objects.filter(session=session, type="error", data__code="recovery_failed").count() == 1
    )
    assert brain.recover_stale_sessions() == 0  # and it is not woken again


def test_a_parked_turn_stays_waiting_and_says_so(tenant_a, owner_a, model_config_a):
    session = new_session(tenant_a, owner_a)
    policy = ApprovalPolicy.objects.create(tenant=tenant_a, name="careful", priority=1)
    ApprovalRule.objects.create(tenant=tenant_a, policy=policy, tool_glob="fs_edit", reason="ask first")
    send(session, "edit it")
    token = brain.acquire(session.pk)
    turn = engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    from sessions_app.runtime.agent import AgentService

    agent = AgentService(session.pk, token)
    agent.prepare(turn.pk)
    assistant = commit_calls(
        session, token, turn, [_call("d1", "fs_edit", path="x", old_text="a", new_text="b")]
    )
    agent.context.history.catch_up(session.pk, None)
    agent._run_calls(assistant.pk, assistant.tool_calls)  # the policy parks it
    agent.close()
    approval = PendingApproval.objects.get(session_id=session.pk)
    Session.objects.filter(pk=session.pk).update(runner_token=token)  # lost before releasing
    _lose_runner(session)

    drive_until_idle(session)

    session.refresh_from_db()
    assert session.status == "waiting_approval"
    recovered = _recovered(session)
    assert f"waiting approval #{approval.pk} (fs_edit)" in recovered["restored"]
    assert recovered["next"] == f"waiting for your decision on fs_edit (approval #{approval.pk})"
    assert not Message.objects.filter(session=session, role="tool").exists()


def test_a_takeover_that_finds_nothing_says_nothing(tenant_a, owner_a):
    session = new_session(tenant_a, owner_a)
    brain.acquire(session.pk)
    _lose_runner(session)

    assert drive_until_idle(session) == ["released"]
    assert not SessionEvent.objects.filter(session=session, type="session.recovered").exists()


def test_guidance_waits_until_the_calls_left_by_recovery_have_run(
    tenant_a, owner_a, model_config_a, model_server
):
    session = new_session(tenant_a, owner_a)
    (engine.workspace_path(session) / "notes.txt").write_text("n")
    _turn_with_calls(session, [_call("r1", "fs_read", path="notes.txt")])
    send(session, "also mention the date", kind="guidance")
    _lose_runner(session)
    model_server.script("agent", text_reply("ok"))

    drive_until_idle(session)

    roles = list(Message.objects.filter(session=session).order_by("id").values_list("role", "tool_call_id"))
    assert roles[1:4] == [("assistant", ""), ("tool", "r1"), ("user", "")]
    assert_tool_pairs(session)


def test_a_turn_lost_while_compressing_goes_on_running(tenant_a, owner_a, model_config_a, model_server):
    session = new_session(tenant_a, owner_a)
    send(session, "long task")
    token = brain.acquire(session.pk)
    turn = engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    with engine.locked_session(session.pk, token) as locked:
        engine.set_status(locked, "compressing")
    _lose_runner(session)
    model_server.script("agent", text_reply("done"))

    assert brain.recover_stale_sessions() == 1
    drive_until_idle(session)

    assert Turn.objects.get(pk=turn.pk).reason == "completed"
    assert any("the compaction in progress was stopped" in line for line in _recovered(session)["restored"])


def test_a_compressing_turn_without_a_runner_is_not_woken_for_nothing(tenant_a, owner_a):
    session = new_session(tenant_a, owner_a)
    send(session, "long task")
    token = brain.acquire(session.pk)
    engine.start_turn(session.pk, token, engine.queued_inputs(session.pk).first())
    with engine.locked_session(session.pk, token) as locked:
        engine.set_status(locked, "compressing")
    Session.objects.filter(pk=session.pk).update(runner_token=None, runner_holder="", lease_expires_at=None)

    assert brain.recover_stale_sessions() == 0
