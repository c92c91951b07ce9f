"""Sandboxes are isolated from each other: a uid each, workspaces nobody else can enter, a bounded
/tmp, and no fallback to running without namespaces unless an operator chose it.

The flood tests are bounded (a few hundred processes at most, ARCHITECTURE §7).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from django.conf import settings

from tools_app.base import ToolError
from tools_app.sandbox import SandboxLimits, identity, run_sandboxed  # noqa: F401
from tools_app.sandbox import process as sandbox_process
from tools_app.workspace import workspace_for

IS_ROOT = os.geteuid() == 0

pytestmark = pytest.mark.skipif(
    not os.access(sandbox_process.BWRAP, os.X_OK), reason="bubblewrap is not installed"
)
root_only = pytest.mark.skipif(not IS_ROOT, reason="only a root worker gives each sandbox its own uid")


def uid_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def named_workspace(shared_tmp: Path, name: str) -> Path:
    return workspace_for(shared_tmp / "workspaces", "acme", name)


@root_only
def test_two_sandboxes_running_at_once_have_different_uids(shared_tmp):
    first, second = named_workspace(shared_tmp, "one"), named_workspace(shared_tmp, "two")
    seen: dict[str, int] = {}
    barrier = threading.Barrier(2)

    def go(name: str, ws: Path):
        barrier.wait()
        result = run_sandboxed("sleep 0.5; id -u", ws, SandboxLimits())
        seen[name] = int(result.stdout.strip())
        assert seen[name] == result.uid

    threads = [threading.Thread(target=go, args=a) for a in (("one", first), ("two", second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    low, high = settings.XAGENT_SANDBOX_UIDS
    assert seen["one"] != seen["two"]
    assert all(low <= uid <= high for uid in seen.values())


@root_only
def test_a_held_process_flood_in_one_session_does_not_stop_anothers_commands(shared_tmp):
    """The attack: one Session holds ~60 processes of the shared_tmp sandbox uid, and every other
    sandbox then could not create its namespaces (or, with the fallback, ran unconfined)."""
    flooding, other = named_workspace(shared_tmp, "flooding"), named_workspace(shared_tmp, "other")
    flood: dict = {}

    def hold():
        flood["run"] = run_sandboxed(
            # dash gives up at the first fork that fails; the sleeps it started stay, held.
            "(for i in $(seq 1 200); do sleep 8 & echo started; done); exec sleep 8",
            flooding,
            SandboxLimits(max_processes=64, wall_seconds=6),
        )

    holder = threading.Thread(target=hold)
    holder.start()
    # Wait until the flood holds its processes (a uid of the range with many of them).
    holding_uid = None
    deadline = time.monotonic() + 10
    while holding_uid is None and time.monotonic() < deadline:
        counts = Counter(uid_of(pid) for pid in os.listdir("/proc") if pid.isdigit())
        low, high = settings.XAGENT_SANDBOX_UIDS
        holding_uid = next((uid for uid, n in counts.items() if uid and low <= uid <= high and n > 20), None)
        time.sleep(0.05)
    assert holding_uid is not None
    try:
        results = []
        for _ in range(3):
            results.append(run_sandboxed("echo ok; id -u", other, SandboxLimits(max_processes=8)))
    finally:
        holder.join()

    for result in results:
        assert result.sandboxed and result.exit_code == 0, result.stderr
        assert result.stdout.splitlines()[0] == "ok"
        assert int(result.stdout.splitlines()[1]) != flood["run"].uid
    assert holding_uid == flood["run"].uid
    assert 0 < flood["run"].stdout.count("started") < 200  # the flood ran, bounded by its own limit
    assert identity.processes_of(flood["run"].uid) == []  # and nothing of it outlived the run


@root_only
def test_a_workspace_at_rest_belongs_to_the_worker_and_nobody_else_enters_it(shared_tmp):
    ws = named_workspace(shared_tmp, "rest")
    (ws / "before.txt").write_text("x")
    result = run_sandboxed("mkdir -p sub && echo y > sub/made.txt && ls -ln before.txt", ws, SandboxLimits())

    # During the run the files were the run's uid's (it could write them)...
    assert f" {result.uid} {result.uid} " in result.stdout
    # ...and afterwards the worker's again, in a 0700 directory.
    assert stat.S_IMODE(ws.stat().st_mode) == 0o700
    for path in (ws, ws / "before.txt", ws / "sub", ws / "sub" / "made.txt"):
        st = path.lstat()
        assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid()), path


@root_only
def test_a_uid_goes_back_to_the_pool_after_the_run(shared_tmp, settings):
    # A range of one uid: a second run can only start if the first handed it back.
    low = settings.XAGENT_SANDBOX_UIDS[0] + 900
    settings.XAGENT_SANDBOX_UIDS = (low, low)
    ws = named_workspace(shared_tmp, "pool")
    first = run_sandboxed("id -u", ws, SandboxLimits())
    second = run_sandboxed("id -u", ws, SandboxLimits())
    assert first.uid == second.uid == low

    held = identity.acquire()
    try:
        with pytest.raises(ToolError) as busy:
            run_sandboxed("id -u", ws, SandboxLimits())
        assert busy.value.code == "sandbox_unavailable"
        assert "sandbox identities" in str(busy.value)
    finally:
        held.release()


def test_tmp_is_bounded_by_the_memory_limit(shared_tmp):
    ws = named_workspace(shared_tmp, "tmp")
    result = run_sandboxed(
        "for i in $(seq 1 12); do head -c 8M /dev/zero > /tmp/f$i || { echo full at $i; break; }; done",
        ws,
        SandboxLimits(memory_mb=64, max_file_size_mb=50),
    )
    assert "full at" in result.stdout, result.stdout + result.stderr
    assert "No space left on device" in result.stderr
