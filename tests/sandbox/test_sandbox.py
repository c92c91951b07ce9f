"""ProcessSandbox and shell_exec against REAL bubblewrap (ARCHITECTURE §7).

Each attack test asserts three things: the attack is contained (with a readable outcome), the
host is unchanged, and the next call in the same workspace still works. Floods and bombs are
bounded (hundreds of processes, a few GiB) so a broken sandbox cannot take the machine down.
Network tests only ever address loopback (127.0.0.1, ::1) or a reserved `.invalid` name.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
import socket
import stat
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from jsonschema import Draft202012Validator

from approvals_app.choices import Risk
from tools_app.base import ToolContext, ToolError
from tools_app.native.shell import ShellExec
from tools_app.sandbox import DEFAULT_LIMITS, SandboxLimits, run_sandboxed
from tools_app.sandbox import process as sandbox_process
from tools_app.workspace import workspace_for

pytestmark = pytest.mark.skipif(
    not os.access(sandbox_process.BWRAP, os.X_OK),
    reason=f"bubblewrap is not installed at {sandbox_process.BWRAP} (CI installs it: apt-get install bubblewrap)",
)

IS_ROOT = os.geteuid() == 0
# A root worker runs each sandbox as a uid of its own from this range; otherwise as itself.
SANDBOX_UIDS = range(settings.XAGENT_SANDBOX_UIDS[0], settings.XAGENT_SANDBOX_UIDS[1] + 1)


def is_sandbox_uid(uid: int) -> bool:
    return uid in SANDBOX_UIDS if IS_ROOT else uid == os.getuid()


SECRET = "s3cr3t-host-value-7f1d"


class FakePort:
    def __init__(self):
        self.file_changes: list[tuple[str, str]] = []

    def plan_create(self, title, tasks):  # pragma: no cover - not used by shell_exec
        raise AssertionError("unexpected")

    def plan_update(self, updates):  # pragma: no cover
        raise AssertionError("unexpected")

    def task_complete(self, task_id, summary):  # pragma: no cover
        raise AssertionError("unexpected")

    def file_changed(self, path: str, op: str) -> None:
        self.file_changes.append((path, op))


@pytest.fixture
def host_dir(shared_tmp: Path) -> Path:
    """Stands for everything of the host outside the workspace (beside it, reachable by path)."""
    host = shared_tmp / "host"
    host.mkdir()
    (host / "secret.txt").write_text(SECRET)
    return host


def run(command: str, workspace: Path, **limits) -> sandbox_process.SandboxRun:
    return run_sandboxed(command, workspace, SandboxLimits(**{"wall_seconds": 20, **limits}))


def assert_next_call_works(workspace: Path) -> None:
    after = run("echo still-ok && touch after-check && rm after-check", workspace)
    assert (after.exit_code, after.stdout, after.killed_reason) == (0, "still-ok\n", None)
    assert after.sandboxed


def output(result) -> str:
    return result.stdout + result.stderr


def processes_of(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as fh:
                status = fh.read()
        except OSError:
            continue
        match = re.search(r"^Uid:\s+(\d+)", status, re.M)
        if match and int(match.group(1)) == uid and "State:\tZ" not in status:
            pids.append(int(entry))
    return pids


def host_cmdlines_containing(needle: bytes) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if needle in fh.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


# --- limits value -----------------------------------------------------------------------------


def test_limits_defaults_and_validation():
    assert DEFAULT_LIMITS == SandboxLimits()
    assert (DEFAULT_LIMITS.filesystem, DEFAULT_LIMITS.network, DEFAULT_LIMITS.fallback) == (
        "workspace_write",
        False,
        "refuse",
    )
    assert SandboxLimits(
        **{f.name: getattr(DEFAULT_LIMITS, f.name) for f in dataclasses.fields(SandboxLimits)}
    )
    for bad in (
        {"filesystem": "everything"},
        {"fallback": "yolo"},
        {"network": "yes"},
        {"cpu_seconds": 0},
        {"memory_mb": 1},
        {"max_processes": True},
        {"wall_seconds": 1.5},
        {"max_output_bytes": 10},
    ):
        with pytest.raises(ValueError):
            SandboxLimits(**bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_LIMITS.network = True  # type: ignore[misc]


# --- ordinary commands ------------------------------------------------------------------------


def test_runs_common_tools_in_the_workspace_as_unprivileged_user(workspace):
    (workspace / "data.txt").write_text("one\ntwo\n")
    result = run(
        "pwd; id -u; echo $HOME; cat data.txt | head -n 1; yes | head -n 2; ls; "
        "python3 -c 'import sys; print(sys.version_info[0])'; echo err >&2; exit 3",
        workspace,
    )

    assert result.exit_code == 3
    assert result.sandboxed and result.killed_reason is None and not result.timed_out
    assert is_sandbox_uid(result.uid)
    assert result.stdout.splitlines() == [
        "/workspace",
        str(result.uid),
        "/workspace",
        "one",
        "y",
        "y",
        "data.txt",
        "3",
    ]
    assert result.stderr == "err\n"
    assert result.changed_files == []


def test_given_env_reaches_the_command_but_not_a_host_command_line(workspace):
    seen: list[int] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.extend(host_cmdlines_containing(SECRET.encode()))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = run_sandboxed(
            'sleep 0.5; echo "token=$API_TOKEN"', workspace, DEFAULT_LIMITS, env={"API_TOKEN": SECRET}
        )
    finally:
        stop.set()
        watcher.join()

    assert result.stdout == f"token={SECRET}\n"
    assert seen == [], "the env value was visible in a host process's command line"


def test_refuses_bad_env_and_empty_command(workspace):
    with pytest.raises(ToolError) as caught:
        run_sandboxed("true", workspace, DEFAULT_LIMITS, env={"BAD-NAME": "x"})
    assert caught.value.code == "invalid_env"
    with pytest.raises(ToolError) as caught:
        run_sandboxed("  ", workspace, DEFAULT_LIMITS)
    assert caught.value.code == "invalid_command"


def test_changed_files_report_created_modified_deleted(workspace):
    (workspace / "keep.txt").write_text("same")
    (workspace / "edit.txt").write_text("before")
    (workspace / "gone.txt").write_text("bye")
    private = workspace / "private.txt"
    private.write_text("root wrote this 0600")
    private.chmod(0o600)

    result = run(
        "cat private.txt; echo after >> edit.txt; rm gone.txt; mkdir -p sub/deeper; "
        "echo new > sub/deeper/new.txt; ln -s keep.txt link",
        workspace,
    )

    assert result.exit_code == 0, result.stderr
    assert result.stdout == "root wrote this 0600"  # the pre-run chown made it readable
    assert result.changed_files == [
        ("edit.txt", "modified"),
        ("gone.txt", "deleted"),
        ("link", "created"),
        ("sub/deeper/new.txt", "created"),
    ]
    assert (workspace / "sub/deeper/new.txt").read_text() == "new\n"
    assert_next_call_works(workspace)


def test_read_only_filesystem_policy_refuses_writes_in_the_workspace(workspace):
    (workspace / "a.txt").write_text("original")

    result = run("cat a.txt; echo x > a.txt; touch b.txt", workspace, filesystem="read_only")

    assert result.exit_code != 0
    assert result.stdout == "original"
    assert "Read-only file system" in result.stderr
    assert (workspace / "a.txt").read_text() == "original"
    assert not (workspace / "b.txt").exists()
    assert result.changed_files == []
    assert_next_call_works(workspace)


# --- filesystem confinement -------------------------------------------------------------------


def test_host_files_outside_the_workspace_are_not_visible(workspace, host_dir):
    secret_path = host_dir / "secret.txt"
    rel_from_ws = os.path.relpath(secret_path, workspace)

    result = run(
        f"ls /root /home /var /work; cat ../secret.txt; cat {rel_from_ws}; cat ../../host/secret.txt; "
        f"ls {host_dir}; cat {secret_path}",
        workspace,
    )

    assert SECRET not in output(result)
    assert result.exit_code != 0
    assert result.stderr.count("No such file or directory") == 9, result.stderr
    assert secret_path.read_text() == SECRET
    assert_next_call_works(workspace)


def test_writes_outside_the_workspace_fail_and_the_host_is_unchanged(workspace):
    marker = f"evil-{os.getpid()}"
    result = run(
        f"echo x > /usr/{marker}; echo x > /{marker}; echo x > /etc/{marker}; "
        f"echo x > /tmp/{marker} && echo tmp-ok; echo x > ../{marker}",
        workspace,
    )

    assert result.stderr.count("Read-only file system") + result.stderr.count("Permission denied") >= 4
    assert "tmp-ok" in result.stdout  # the sandbox's private /tmp
    for host_path in (f"/usr/{marker}", f"/{marker}", f"/etc/{marker}", f"/tmp/{marker}"):
        assert not os.path.exists(host_path), host_path
    assert not (workspace.parent / marker).exists()
    assert result.changed_files == []
    assert_next_call_works(workspace)


def test_a_symlink_to_a_host_directory_leads_nowhere(workspace, host_dir):
    os.symlink(host_dir, workspace / "link")  # absolute host path, planted by someone

    result = run("cat link/secret.txt; echo pwned > link/pwned.txt; ls link/", workspace)

    assert SECRET not in output(result)
    assert result.exit_code != 0
    assert "No such file or directory" in result.stderr
    assert sorted(p.name for p in host_dir.iterdir()) == ["secret.txt"]
    assert result.changed_files == []
    assert_next_call_works(workspace)


@pytest.mark.skipif(not IS_ROOT, reason="the pre-run chown only happens when the worker is root")
def test_links_planted_by_the_sandbox_never_redirect_the_pre_run_chown(workspace, host_dir):
    secret = host_dir / "secret.txt"
    planted = run(f"ln -s {secret} file-link; ln -s {host_dir} dir-link; ln -s / root-link", workspace)
    assert planted.exit_code == 0, planted.stderr

    assert_next_call_works(workspace)  # this run's pre-run walk meets the links

    for path in (secret, host_dir, Path("/")):
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (0, 0), path
    # Handed back to the worker after the run, the link itself (never what it points to).
    assert os.lstat(workspace / "file-link").st_uid == os.getuid()


def test_proc_shows_neither_host_env_nor_host_processes(workspace, monkeypatch):
    monkeypatch.setenv("XAGENT_HOST_MARKER", SECRET)

    result = run(
        "cat /proc/1/environ /proc/self/environ; for p in /proc/[0-9]*; do cat $p/environ $p/cmdline; done; "
        "echo; ls -d /proc/[0-9]* | wc -l; ls /proc/self/fd",
        workspace,
    )

    assert SECRET not in output(result)
    assert "pytest" not in result.stdout
    lines = result.stdout.strip().splitlines()
    assert set(lines[-4:]) <= {"0", "1", "2", "3"}, "a host fd leaked into the sandbox"
    assert int(lines[-5]) < 10  # only the sandbox's own few processes
    assert_next_call_works(workspace)


# --- network ------------------------------------------------------------------------------------


def _listener(family: int, host: str) -> socket.socket:
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind((host, 0))
    server.listen(8)
    server.setblocking(False)
    return server


def _assert_no_connection(server: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        server.accept()


def test_no_tcp_to_the_hosts_ipv4_loopback(workspace):
    server = _listener(socket.AF_INET, "127.0.0.1")
    try:
        port = server.getsockname()[1]
        result = run(
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); "
            "print('CONNECTED')\"",
            workspace,
        )
        assert result.exit_code != 0
        assert "CONNECTED" not in result.stdout
        assert "ConnectionRefusedError" in result.stderr or "unreachable" in result.stderr
        _assert_no_connection(server)
    finally:
        server.close()
    assert_next_call_works(workspace)


def test_no_tcp_to_the_hosts_ipv6_loopback(workspace):
    try:
        server = _listener(socket.AF_INET6, "::1")
    except OSError:
        pytest.skip("no IPv6 loopback on this host")
    try:
        port = server.getsockname()[1]
        result = run(
            f"python3 -c \"import socket; socket.create_connection(('::1', {port}), timeout=3); "
            "print('CONNECTED')\"",
            workspace,
        )
        assert result.exit_code != 0
        assert "CONNECTED" not in result.stdout
        assert re.search(r"ConnectionRefusedError|unreachable|Cannot assign", result.stderr), result.stderr
        _assert_no_connection(server)
    finally:
        server.close()
    assert_next_call_works(workspace)


def test_no_name_resolution_and_only_a_loopback_interface(workspace):
    result = run(
        'python3 -c "import socket; print(sorted(n for _, n in socket.if_nameindex()))"; '
        "python3 -c \"import socket; print(socket.getaddrinfo('example.invalid', 80))\"",
        workspace,
    )

    assert result.stdout.splitlines()[0] == "['lo']"
    assert "gaierror" in result.stderr
    assert result.exit_code != 0
    assert_next_call_works(workspace)


def test_a_network_policy_never_reaches_the_hosts_loopback_directly(workspace):
    """`network` is egress through the guard's proxy (tests/sandbox/test_egress.py), never the
    host's network namespace: a direct connection to a host listener finds nothing."""
    server = _listener(socket.AF_INET, "127.0.0.1")
    try:
        port = server.getsockname()[1]
        result = run(
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); "
            "print('CONNECTED')\"",
            workspace,
            network=True,
        )
        assert "CONNECTED" not in result.stdout
        assert "ConnectionRefusedError" in result.stderr, result.stderr
        _assert_no_connection(server)
    finally:
        server.close()


def test_only_the_operators_host_network_shares_the_host_network(workspace):
    server = _listener(socket.AF_INET, "127.0.0.1")
    server.settimeout(5)
    try:
        port = server.getsockname()[1]
        result = run(
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); "
            "print('CONNECTED')\"",
            workspace,
            host_network=True,
        )
        assert result.stdout == "CONNECTED\n", result.stderr
        conn, _ = server.accept()
        conn.close()
    finally:
        server.close()


# --- resource limits ----------------------------------------------------------------------------


def test_bounded_fork_flood_is_refused_and_fully_cleaned_up(workspace):
    result = run(
        'for i in $(seq 1 300); do sleep 5 & echo "started $i"; done; wait',
        workspace,
        max_processes=32,
        wall_seconds=3,
    )

    started = result.stdout.count("started")
    assert 0 < started < 300, started
    assert re.search(r"fork|Resource temporarily unavailable", result.stderr, re.I), result.stderr
    # Every process of the run is gone by the time run_sandboxed returns.
    if IS_ROOT:
        assert processes_of(result.uid) == []
    assert_next_call_works(workspace)


def test_bounded_memory_bomb_fails_and_the_worker_survives(workspace):
    script = (
        "import sys\n"
        "blocks = []\n"
        "for i in range(16):\n"  # 16 x 256 MiB = 4 GiB at most
        "    blocks.append(bytearray(256 << 20))\n"
        "    print('allocated', i + 1, flush=True)\n"
    )
    (workspace / "bomb.py").write_text(script)

    result = run("python3 bomb.py", workspace, memory_mb=256)

    assert result.exit_code != 0
    assert "MemoryError" in result.stderr or result.killed_reason is not None
    assert result.stdout.count("allocated") < 16
    assert_next_call_works(workspace)


def test_disk_fill_stops_at_the_file_size_limit(workspace):
    result = run("yes > big", workspace, max_file_size_mb=5)

    size = (workspace / "big").stat().st_size
    assert 0 < size <= 5 * 1024 * 1024
    assert result.killed_reason == "file_size_limit"
    assert result.exit_code != 0
    assert ("big", "created") in result.changed_files
    assert_next_call_works(workspace)


def test_cpu_loop_is_killed_by_the_cpu_limit(workspace):
    result = run('python3 -c "while True: pass"', workspace, cpu_seconds=2, wall_seconds=10)

    assert result.killed_reason == "cpu_limit"
    assert not result.timed_out
    assert result.exit_code != 0
    assert_next_call_works(workspace)


def test_wall_timeout_kills_the_whole_run(workspace):
    result = run("sleep 37 & sleep 38; echo never", workspace, wall_seconds=2)

    assert result.timed_out and result.killed_reason == "timeout"
    assert "never" not in result.stdout
    assert host_cmdlines_containing(b"sleep\x0037") == []
    assert host_cmdlines_containing(b"sleep\x0038") == []
    assert_next_call_works(workspace)


def test_output_flood_is_capped_and_stopped(workspace):
    result = run("yes | head -c 100000000", workspace, max_output_bytes=100_000)

    assert result.stdout_truncated and not result.stderr_truncated
    assert result.stdout.startswith("y\ny\n")
    assert (
        "…[stdout truncated: " in result.stdout
        and "showing the first 50,000 and last 50,000 bytes" in result.stdout
    )
    assert "the command was stopped for producing over 5,000,000 bytes" in result.stdout
    assert len(result.stdout.encode()) < 100_000 + 500
    assert result.killed_reason == "output_limit"  # stopped long before 100 MB
    assert_next_call_works(workspace)


def test_output_over_the_cap_but_not_a_flood_runs_to_completion(workspace):
    result = run(
        "head -c 300000 /dev/zero | tr '\\0' 'a'; echo done >&2", workspace, max_output_bytes=100_000
    )

    assert result.exit_code == 0 and result.killed_reason is None
    assert result.stdout_truncated
    assert "200,000 bytes omitted here" in result.stdout
    assert result.stdout.startswith("a" * 50_000 + "\n…[") and result.stdout.endswith("]…\n" + "a" * 50_000)
    assert result.stderr == "done\n"


def test_cancel_event_stops_the_run(workspace):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()

    result = run_sandboxed("sleep 39", workspace, DEFAULT_LIMITS, cancel=cancel)

    assert result.killed_reason == "cancelled" and not result.timed_out
    assert host_cmdlines_containing(b"sleep\x0039") == []
    assert_next_call_works(workspace)


# --- sandbox unavailable ------------------------------------------------------------------------


@pytest.fixture
def broken_bwrap(shared_tmp, monkeypatch) -> Path:
    """A 'bwrap' that fails the way a host without user namespaces makes the real one fail."""
    fake = shared_tmp / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox_process, "BWRAP", str(fake))
    return fake


def test_missing_bwrap_is_refused_by_default(workspace, monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox_process, "BWRAP", str(tmp_path / "no-such-bwrap"))

    with pytest.raises(ToolError) as caught:
        run("echo hi > should-not-exist", workspace)

    assert (caught.value.code, caught.value.stage) == ("sandbox_unavailable", "runtime")
    assert "not installed" in str(caught.value) and "refuse" in str(caught.value)
    assert not (workspace / "should-not-exist").exists()


def test_bwrap_that_cannot_build_namespaces_is_refused(workspace, broken_bwrap):
    with pytest.raises(ToolError) as caught:
        run("echo hi > should-not-exist", workspace)

    assert caught.value.code == "sandbox_unavailable"
    assert "No permissions to creating new namespace" in str(caught.value)
    assert not (workspace / "should-not-exist").exists()


@pytest.mark.skipif(not IS_ROOT, reason="only the root worker drops to the sandbox uid")
def test_workspace_under_a_root_only_directory_is_refused_clearly(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    workspace = workspace_for(locked, "acme", "session-1")

    for fallback in ("refuse", "rlimits_only"):
        with pytest.raises(ToolError) as caught:
            run("echo hi > should-not-exist", workspace, fallback=fallback)
        assert caught.value.code == "sandbox_unavailable"
        assert "not searchable by the sandbox users" in str(caught.value)
        assert str(tmp_path) not in str(caught.value)  # no host path in what the model reads
    assert not (workspace / "should-not-exist").exists()


def test_rlimits_only_fallback_runs_unsandboxed_and_logs(workspace, broken_bwrap, caplog):
    with caplog.at_level(logging.WARNING, logger="tools_app.sandbox.process"):
        result = run(
            "id -u; echo hi > made.txt; yes > big",
            workspace,
            fallback="rlimits_only",
            max_file_size_mb=1,
        )

    assert not result.sandboxed
    assert result.stdout.splitlines()[0] == str(result.uid)  # the uid drop still happened
    assert is_sandbox_uid(result.uid)
    assert result.killed_reason == "file_size_limit"  # and the rlimits applied
    assert (workspace / "big").stat().st_size <= 1024 * 1024
    assert ("made.txt", "created") in result.changed_files
    assert any("rlimits only" in r.getMessage() for r in caplog.records)


def test_the_command_cannot_fake_a_sandbox_failure_to_get_the_fallback(workspace):
    result = run(
        "echo 'bwrap: No permissions to creating new namespace' >&2; exit 1",
        workspace,
        fallback="rlimits_only",
    )

    assert result.sandboxed
    assert result.exit_code == 1


# --- shell_exec tool ----------------------------------------------------------------------------


@pytest.fixture
def port() -> FakePort:
    return FakePort()


@pytest.fixture
def ctx(workspace, port) -> ToolContext:
    return ToolContext(session_id="session-1", tenant_id=1, workspace=workspace, port=port, call_id="c1")


def test_shell_exec_schema_and_metadata():
    tool = ShellExec()
    validator = Draft202012Validator(tool.input_schema)
    assert tool.name == "shell_exec" and tool.risk == Risk.EXTERNAL and not tool.read_only
    assert validator.is_valid({"command": "ls"})
    assert validator.is_valid({"command": "ls", "timeout_seconds": 600})
    for bad in (
        {},
        {"command": "ls", "timeout_seconds": 0},
        {"command": "ls", "timeout_seconds": 601},
        {"command": "ls", "cwd": "/"},
    ):
        assert not validator.is_valid(bad), bad


def test_shell_exec_reports_output_and_changed_files_through_the_port(ctx, port, workspace):
    ctx.sandbox_limits = SandboxLimits(wall_seconds=10)  # type: ignore[attr-defined]
    ctx.env = {"GREETING": "hello"}  # type: ignore[attr-defined]
    (workspace / "old.txt").write_text("x")

    result = ShellExec().run(ctx, {"command": 'echo "$GREETING" | tee notes.txt; rm old.txt; echo warn >&2'})

    assert not result.is_error
    assert result.content.startswith("exit code: 0 (took ")
    assert "stdout:\nhello\nstderr:\nwarn\n" in result.content
    assert "changed files (2):\n  created notes.txt\n  deleted old.txt" in result.content
    assert result.summary.startswith("exit 0 in ") and result.summary.endswith(", 2 files changed")
    assert port.file_changes == [("notes.txt", "created"), ("old.txt", "deleted")]
    assert result.data["changed_files"] == [
        {"path": "notes.txt", "op": "created"},
        {"path": "old.txt", "op": "deleted"},
    ]


def test_shell_exec_non_zero_exit_is_a_normal_result(ctx, port):
    result = ShellExec().run(ctx, {"command": "echo oops >&2; exit 4"})

    assert not result.is_error
    assert result.summary.startswith("exit 4 in ")
    assert "exit code: 4" in result.content and "stdout: (empty)" in result.content
    assert "stderr:\noops" in result.content
    assert port.file_changes == []


def test_shell_exec_timeout_is_an_error_and_capped_by_the_policy(ctx):
    ctx.sandbox_limits = SandboxLimits(wall_seconds=1)  # type: ignore[attr-defined]

    # A duration of this run's own, so no other process (another run of this suite) can match.
    duration = f"40.{secrets.randbelow(10**6):06d}"
    result = ShellExec().run(ctx, {"command": f"sleep {duration}", "timeout_seconds": 600})

    assert result.is_error
    assert result.data["timed_out"] and result.data["killed_reason"] == "timeout"
    assert result.summary == "timed out after 1 s"
    assert result.content.startswith("the command was killed: it ran past the 1 s wall-clock limit\n")
    # Killed with its namespace; the kernel may still be reaping it on a loaded machine (seen in
    # CI once), so give it a moment — a survivor would still be here long after.
    deadline = time.monotonic() + 10
    mine = b"sleep\x00" + duration.encode()
    while host_cmdlines_containing(mine) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert host_cmdlines_containing(mine) == []


def test_shell_exec_keeps_long_output_readable(ctx):
    result = ShellExec().run(ctx, {"command": "seq 1 100000; echo the-error >&2; exit 1"})

    assert not result.is_error and "exit code: 1" in result.content
    assert len(result.content) < 20_000  # under ToolService.MAX_RESULT_CHARS: nothing cut blindly
    assert "\n1\n2\n3\n" in result.content and "100000" in result.content  # head and tail
    assert "characters omitted" in result.content and "the-error" in result.content


def test_shell_exec_refuses_when_the_sandbox_is_unavailable(ctx, broken_bwrap):
    with pytest.raises(ToolError) as caught:
        ShellExec().run(ctx, {"command": "echo hi"})
    assert caught.value.code == "sandbox_unavailable"


def test_workspace_root_stays_a_directory_nobody_else_can_enter(workspace):
    assert_next_call_works(workspace)
    st = workspace.stat()
    assert stat.S_ISDIR(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.getuid()  # at rest: the worker's, no sandbox uid's
