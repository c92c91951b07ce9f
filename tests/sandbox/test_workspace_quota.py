"""Workspace quotas hold against the sandbox (ARCHITECTURE §7; `tools_app.sandbox.quota`).

Real bubblewrap, real files. Each test checks the workspace as the run left it (counted as
uploads count it, `workspace_usage`), that files which existed before the run are untouched, and
what the run reports. Floods are bounded: at most a few thousand small files or a few hundred
MB, and the endless ones end at their wall-clock limit if the quota check ever failed to stop
them (the tests then fail on killed_reason, never on time).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from tools_app.base import ToolContext
from tools_app.native.shell import ShellExec
from tools_app.sandbox import SandboxLimits, run_sandboxed
from tools_app.sandbox import process as sandbox_process
from tools_app.sandbox import quota as sandbox_quota
from tools_app.sandbox.quota import WorkspaceQuota
from tools_app.service import ToolService
from tools_app.workspace import workspace_usage

pytestmark = pytest.mark.skipif(
    not os.access(sandbox_process.BWRAP, os.X_OK),
    reason=f"bubblewrap is not installed at {sandbox_process.BWRAP} (CI installs it: apt-get install bubblewrap)",
)

MIB = 1024 * 1024
IS_ROOT = os.geteuid() == 0


class FakePort:
    """The SessionPort's one operation shell_exec calls."""

    def __init__(self):
        self.file_changes: list[tuple[str, str]] = []

    def file_changed(self, path: str, op: str) -> None:
        self.file_changes.append((path, op))


@pytest.fixture
def port() -> FakePort:
    return FakePort()


@pytest.fixture
def ctx(workspace, port) -> ToolContext:
    return ToolContext(
        session_id="session-1",
        tenant_id=1,
        workspace=workspace,
        port=port,
        call_id="c1",
        sandbox_limits=SandboxLimits(wall_seconds=20),
    )


def run(command: str, workspace: Path, quota: WorkspaceQuota, **limits) -> sandbox_process.SandboxRun:
    return run_sandboxed(command, workspace, SandboxLimits(**{"wall_seconds": 20, **limits}), quota=quota)


def fingerprint(path: Path) -> tuple[int, int, bytes]:
    st = path.stat()
    return st.st_ino, st.st_size, path.read_bytes()


def names(workspace: Path) -> set[str]:
    return {p.relative_to(workspace).as_posix() for p in workspace.rglob("*") if p.is_file()}


def test_a_command_writing_more_bytes_than_the_quota_keeps_its_oldest_files_within_it(workspace):
    (workspace / "notes.txt").write_text("precious")
    (workspace / "existing.bin").write_bytes(b"e" * MIB)
    kept_before = {name: fingerprint(workspace / name) for name in ("notes.txt", "existing.bin")}
    quota = WorkspaceQuota(max_bytes=5 * MIB, max_files=2000)

    result = run("for i in $(seq -w 1 20); do head -c 1048576 /dev/zero > out$i.bin; done", workspace, quota)

    # Stopped on the way or found over at the end: either way over, and cleaned up.
    assert result.killed_reason in (None, "quota_exceeded")
    report = result.quota
    assert report.exceeded and not report.still_over
    files, used = workspace_usage(workspace)
    assert used <= quota.max_bytes
    assert (report.after.files, report.after.bytes) == (files, used)
    # Newest first: what is left is the command's first files, as many as fit (1 MiB + 8 bytes
    # were there already, so three more MiB).
    assert names(workspace) == {"notes.txt", "existing.bin", "out01.bin", "out02.bin", "out03.bin"}
    removed = [path for path, _ in report.removed]
    assert removed == sorted(removed, reverse=True) and removed[-1] == "out04.bin"
    assert {name: fingerprint(workspace / name) for name in kept_before} == kept_before
    assert result.changed_files == [(f"out0{i}.bin", "created") for i in (1, 2, 3)]


def test_shell_exec_creating_more_files_than_the_limit_reports_the_quota(ctx, port, workspace, settings):
    settings.XAGENT_WORKSPACE_MAX_FILES = 50
    for i in range(5):
        (workspace / f"mine{i}.txt").write_text(f"kept {i}")
    kept_before = {f"mine{i}.txt": fingerprint(workspace / f"mine{i}.txt") for i in range(5)}

    result = ShellExec().run(ctx, {"command": "mkdir out; for i in $(seq -w 1 500); do : > out/f$i; done"})

    assert result.is_error and result.error_code == "quota_exceeded"
    quota = result.data["quota"]
    assert quota["exceeded"] and not quota["still_over"]
    assert quota["max_files"] == 50 and quota["before"] == {"files": 5, "bytes": 30}
    assert quota["after"]["files"] == 50 == workspace_usage(workspace)[0]
    assert names(workspace) == set(kept_before) | {f"out/f{i:03d}" for i in range(1, 46)}
    assert {name: fingerprint(workspace / name) for name in kept_before} == kept_before
    removed = [entry["path"] for entry in quota["removed"]]
    # Newest first: everything after the 45th file the command created (all 500, or as many as
    # it had written when it was stopped).
    assert removed == [f"out/f{i:03d}" for i in range(45 + len(removed), 45, -1)]
    assert result.data["killed_reason"] == "quota_exceeded" or len(removed) == 455
    # The model reads the limits and what went; the port hears of every removal, and the
    # changes end in the state on disk.
    assert "at most 50 files" in result.content
    assert f"removed {len(removed)} files this command created (newest first)" in result.content
    assert f"\n  {removed[0]} (0 bytes)\n" in result.content  # the newest, listed first
    assert len(removed) <= 20 or f"\n  …and {len(removed) - 20} more\n" in result.content
    assert [(p, "deleted") for p in removed] == port.file_changes[-len(removed) :]
    final: dict[str, str] = {}
    for path, op in port.file_changes:
        final[path] = op
    assert {p for p, op in final.items() if op == "created"} == {f"out/f{i:03d}" for i in range(1, 46)}
    assert {p for p, op in final.items() if op == "deleted"} == set(removed)
    assert result.data["changed_files"] == [{"path": f"out/f{i:03d}", "op": "created"} for i in range(1, 46)]


def test_a_run_within_the_quota_is_unaffected(ctx, port, workspace, settings):
    settings.XAGENT_WORKSPACE_MAX_BYTES = 5 * MIB
    settings.XAGENT_WORKSPACE_MAX_FILES = 10
    (workspace / "old.txt").write_text("x")

    result = ShellExec().run(
        ctx, {"command": "head -c 1048576 /dev/zero > a.bin; head -c 1048576 /dev/zero > b.bin; rm old.txt"}
    )

    assert not result.is_error and result.data["killed_reason"] is None
    assert result.data["quota"] == {
        "exceeded": False,
        "stopped": False,
        "max_bytes": 5 * MIB,
        "max_files": 10,
        "before": {"files": 1, "bytes": 1},
        "after": {"files": 2, "bytes": 2 * MIB},
        "still_over": False,
        "removed": [],
        "grown": [],
        "complete": True,
        "removable": True,
    }
    assert "quota" not in result.content
    assert names(workspace) == {"a.bin", "b.bin"}
    assert port.file_changes == [("a.bin", "created"), ("b.bin", "created"), ("old.txt", "deleted")]


def test_a_command_that_keeps_creating_files_is_stopped_while_it_runs(ctx, workspace, settings):
    settings.XAGENT_WORKSPACE_MAX_FILES = 20
    # Never ends by itself (bounded by the wall-clock limit: at most a few thousand files).
    command = "i=0; while :; do i=$((i+1)); echo x > f$i; sleep 0.01; done"

    result = ShellExec().run(ctx, {"command": command})

    assert result.data["killed_reason"] == "quota_exceeded"
    assert result.is_error and result.error_code == "quota_exceeded"
    assert result.content.startswith(
        "the command was stopped: the workspace went over its quota (at most 20 files and "
    )
    assert result.data["quota"]["stopped"] and workspace_usage(workspace)[0] == 20
    assert names(workspace) == {f"f{i}" for i in range(1, 21)}


def test_a_command_that_keeps_writing_bytes_is_stopped_while_it_runs(workspace):
    quota = WorkspaceQuota(max_bytes=2 * MIB, max_files=2000)
    # ~10 MB/s at most, so a failed check would leave a few hundred MB at the wall-clock limit.
    command = "i=0; while :; do i=$((i+1)); head -c 262144 /dev/zero > b$i; sleep 0.02; done"

    result = run(command, workspace, quota)

    assert result.killed_reason == "quota_exceeded" and result.quota.stopped
    assert workspace_usage(workspace)[1] <= 2 * MIB
    assert names(workspace) == {f"b{i}" for i in range(1, 9)}  # 8 x 256 KiB fill 2 MiB exactly


def test_a_file_that_existed_before_and_grew_stays_and_keeps_the_workspace_over(
    ctx, port, workspace, settings
):
    settings.XAGENT_WORKSPACE_MAX_BYTES = 3 * MIB
    (workspace / "grow.dat").write_bytes(b"g" * MIB)
    inode = (workspace / "grow.dat").stat().st_ino

    result = ShellExec().run(
        ctx, {"command": "head -c 4194304 /dev/zero >> grow.dat; head -c 1048576 /dev/zero > new.bin"}
    )

    assert result.is_error and result.error_code == "quota_exceeded"
    quota = result.data["quota"]
    assert quota["removed"] == [{"path": "new.bin", "size": MIB}]
    assert quota["grown"] == [{"path": "grow.dat", "size_before": MIB, "size_after": 5 * MIB}]
    assert quota["still_over"] and quota["after"] == {"files": 1, "bytes": 5 * MIB}
    st = (workspace / "grow.dat").stat()
    assert (st.st_ino, st.st_size) == (inode, 5 * MIB) and names(workspace) == {"grow.dat"}
    assert "the workspace is still over its quota (files that existed before the command grew: grow.dat" in (
        result.content
    )
    assert result.content.startswith(
        "the workspace went over its quota (at most 2,000 files and 3,145,728 bytes)"
    )
    assert port.file_changes == [("grow.dat", "modified"), ("new.bin", "deleted")]


def test_files_the_command_renamed_or_linked_are_not_its_own(workspace):
    (workspace / "data.bin").write_bytes(b"d" * 2 * MIB)
    content = (workspace / "data.bin").read_bytes()
    quota = WorkspaceQuota(max_bytes=3 * MIB, max_files=2000)

    result = run(
        "mv data.bin moved.bin && ln moved.bin twin.bin && head -c 2097152 /dev/zero > new.bin",
        workspace,
        quota,
    )

    # moved.bin and twin.bin are the file that was there (same inode): only new.bin goes, and
    # the workspace stays over (the link counts twice, as uploads count it).
    assert [path for path, _ in result.quota.removed] == ["new.bin"]
    assert names(workspace) == {"moved.bin", "twin.bin"}
    assert (workspace / "moved.bin").read_bytes() == content
    assert result.quota.still_over


def test_a_workspace_already_over_its_quota_may_shrink_but_not_grow(workspace):
    (workspace / "big.bin").write_bytes(b"b" * 3 * MIB)
    (workspace / "keep.bin").write_bytes(b"k" * MIB)
    quota = WorkspaceQuota(max_bytes=2 * MIB, max_files=2000)

    shrink = run("rm big.bin; echo ok > result.txt", workspace, quota)
    assert shrink.killed_reason is None and not shrink.quota.exceeded
    assert names(workspace) == {"keep.bin", "result.txt"}

    (workspace / "big.bin").write_bytes(b"b" * 3 * MIB)
    grow = run("echo more > extra.txt", workspace, quota)
    assert grow.quota.exceeded and grow.quota.still_over
    assert [path for path, _ in grow.quota.removed] == ["extra.txt"]
    assert names(workspace) == {"big.bin", "keep.bin", "result.txt"}


def test_the_count_never_follows_a_symlink_out_of_the_workspace(workspace, shared_tmp):
    host = shared_tmp / "host"
    host.mkdir()
    for i in range(30):
        (host / f"h{i}").write_bytes(b"h" * 1000)
    quota = WorkspaceQuota(max_bytes=10_000, max_files=10)

    result = run(
        f"ln -s {host} link; ln -s / root; for i in 1 2 3; do echo x > f$i; done; sleep 1", workspace, quota
    )

    assert result.killed_reason is None and not result.quota.exceeded
    assert result.quota.after.files == 3
    assert len(list(host.iterdir())) == 30


@pytest.mark.skipif(not IS_ROOT, reason="only a root worker runs the sandbox as a uid of its own")
def test_a_file_someone_else_writes_during_the_run_is_never_removed(workspace):
    quota = WorkspaceQuota(max_bytes=100 * MIB, max_files=10)
    command = "while [ ! -e upload.txt ]; do sleep 0.02; done; for i in $(seq -w 1 30); do : > f$i; done"

    def person_uploads():
        # As a person's upload through the files API lands (written by the worker), and newer
        # than anything the command writes.
        time.sleep(0.2)
        path = workspace / "upload.txt"
        path.write_text("the person's file")
        future = time.time() + 3600
        os.utime(path, (future, future))

    person = threading.Thread(target=person_uploads)
    person.start()
    try:
        result = run(command, workspace, quota)
    finally:
        person.join()

    assert (workspace / "upload.txt").read_text() == "the person's file"
    assert "upload.txt" not in [path for path, _ in result.quota.removed]
    assert names(workspace) == {"upload.txt"} | {f"f{i:02d}" for i in range(1, 10)}


def test_a_flood_of_directories_past_the_countable_size_is_stopped(workspace, monkeypatch):
    # Directories and links do not count as files (as for uploads), but a workspace too big to
    # count could not be held to any quota: the run that makes it so is stopped.
    monkeypatch.setattr(sandbox_quota, "MAX_WALK_ENTRIES", 300)
    quota = WorkspaceQuota(max_bytes=MIB, max_files=10)

    result = run("i=0; while :; do i=$((i+1)); mkdir d$i; sleep 0.005; done", workspace, quota)

    assert result.killed_reason == "quota_exceeded" and result.quota.stopped
    assert not result.quota.complete


def test_nothing_is_removed_when_the_workspace_was_too_big_to_count_before(
    ctx, workspace, monkeypatch, settings
):
    monkeypatch.setattr(sandbox_quota, "MAX_WALK_ENTRIES", 300)
    settings.XAGENT_WORKSPACE_MAX_FILES = 10
    for i in range(400):
        (workspace / f"d{i:03d}").mkdir()

    result = ShellExec().run(ctx, {"command": "for i in $(seq -w 1 30); do : > f$i; done"})

    # Which files were there before cannot be told: nothing goes, and the report says so.
    quota = result.data["quota"]
    assert quota["exceeded"] and quota["removed"] == []
    assert not quota["complete"] and not quota["removable"]
    assert "could not be counted completely (it holds more than 300 entries, directories and links" in (
        result.content
    )
    assert "nothing was removed: which files this command created cannot be told" in result.content
    assert len([n for n in names(workspace) if n.startswith("f")]) == 30


def test_the_model_sees_quota_exceeded_as_the_error_code(ctx, workspace, settings):
    settings.XAGENT_WORKSPACE_MAX_FILES = 3
    arguments = json.dumps({"command": "for i in 1 2 3 4 5; do echo $i > n$i; done"})

    outcome = ToolService().execute("c1", "shell_exec", arguments, ctx, {"shell_exec": ShellExec()})

    assert not outcome.ok and (outcome.stage, outcome.error_code) == ("runtime", "quota_exceeded")
    assert outcome.content.startswith(
        "error in runtime (quota_exceeded): the workspace went over its quota (at most 3 files and "
    )
    assert "removed 2 files this command created (newest first)" in outcome.content
    assert names(workspace) == {"n1", "n2", "n3"}


def test_a_read_only_run_has_no_quota_check(workspace):
    result = run("cat /dev/null", workspace, WorkspaceQuota(max_bytes=1, max_files=1), filesystem="read_only")
    assert result.quota is None


def test_files_hidden_deeper_than_the_walk_goes_make_the_run_an_error(ctx, workspace, monkeypatch, settings):
    # A tree deeper than the count reaches would hide what is in it: the run that builds one is
    # over its quota (the result says the count is incomplete), like one that floods entries.
    monkeypatch.setattr(sandbox_quota, "MAX_WALK_DEPTH", 4)
    settings.XAGENT_WORKSPACE_MAX_FILES = 10

    result = ShellExec().run(ctx, {"command": "mkdir -p a/b/c/d/e/f && echo x > a/b/c/d/e/f/deep.txt"})

    assert result.is_error and result.error_code == "quota_exceeded"
    assert result.data["quota"]["exceeded"] and not result.data["quota"]["complete"]
    assert "could not be counted completely" in result.content and "nested more than 4 deep" in result.content
