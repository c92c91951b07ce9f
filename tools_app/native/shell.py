"""Native tool shell_exec: run a shell command in the Session workspace, inside ProcessSandbox.

The limits come from the runtime, not the model: `ctx.sandbox_limits` (a SandboxLimits the
runtime maps from the Session's SandboxPolicy) or DEFAULT_LIMITS, and `ctx.env`, the variables
admins bound in the shell environment of the Session's tool sets (the one way a secret reaches a
process, ARCHITECTURE §7). The model's `env` adds plain variables but cannot set one an admin
bound (refused, so the model is told rather than silently overridden). The model's
`timeout_seconds` can only shorten the policy's wall-clock limit. An optional `ctx.cancel`
(threading.Event) stops the command when set.

A non-zero exit is an ordinary result the model should read (`is_error=False`, the summary says
"exit N"); a run the sandbox stopped (wall/CPU/file-size limit, output flood, cancel) is an
error result. Files the command created, modified or deleted are reported through
`ctx.port.file_changed`.

What the command writes counts against the workspace quota (XAGENT_WORKSPACE_MAX_BYTES /
XAGENT_WORKSPACE_MAX_FILES, as for uploads; `sandbox.quota`): a command that takes the workspace
over it is stopped, the files it created are removed newest first until the workspace is back
within, and the result is an error (`quota_exceeded`) that lists the limits and what was removed,
and says so when files that existed before (and that the command grew) keep the workspace over.
Removed files are reported to the port as deleted (they may have been seen while the command
ran); `changed_files` describe the workspace as the command and the quota check left it.
"""

from __future__ import annotations

import dataclasses
import threading

from approvals_app.choices import Risk
from config.dbconn import hand_back_connections

from ..base import Tool, ToolContext, ToolError, ToolResult
from ..sandbox import quota as sandbox_quota
from ..sandbox.policy import DEFAULT_LIMITS, SandboxLimits
from ..sandbox.process import SandboxRun, run_sandboxed
from ..sandbox.quota import QuotaReport, WorkspaceQuota

MAX_TIMEOUT_SECONDS = 600
# What of stdout + stderr goes into the content, below ToolService.MAX_RESULT_CHARS so the
# generic cap never cuts the exit status or the changed-file list off.
OUTPUT_BUDGET_CHARS = 15_000
MAX_LISTED_CHANGES = 50
MAX_LISTED_REMOVED = 20


def _duration(ms: int) -> str:
    return f"{ms} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def _clip(text: str, budget: int) -> str:
    """Keep the head and (mostly) the tail of `text`: errors usually come last."""
    if len(text) <= budget:
        return text
    head = budget // 3
    tail = budget - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n…[{omitted:,} characters omitted]…\n{text[-tail:]}"


def _split_budget(stdout: str, stderr: str) -> tuple[int, int]:
    if len(stdout) + len(stderr) <= OUTPUT_BUDGET_CHARS:
        return len(stdout), len(stderr)
    # Each stream gets at least a third of the budget if it needs it; the rest goes to the other.
    floor = OUTPUT_BUDGET_CHARS // 3
    err = min(len(stderr), max(floor, OUTPUT_BUDGET_CHARS - len(stdout)))
    return OUTPUT_BUDGET_CHARS - err, err


def _killed_message(run: SandboxRun, limits: SandboxLimits) -> str | None:
    reason = run.killed_reason
    if reason is None:
        return None
    if reason == "timeout":
        return f"the command was killed: it ran past the {limits.wall_seconds} s wall-clock limit"
    if reason == "cancelled":
        return "the command was cancelled"
    if reason == "output_limit":
        return "the command was stopped: it produced far more output than can be shown"
    if reason == "quota_exceeded" and run.quota is not None:
        return f"the command was stopped: the workspace went over its quota ({_limits(run.quota)})"
    if reason == "cpu_limit":
        return f"the command was killed: it used more than the {limits.cpu_seconds} s CPU-time limit"
    if reason == "file_size_limit":
        return (
            f"the command was killed: it tried to write a file larger than the "
            f"{limits.max_file_size_mb} MB file-size limit"
        )
    return f"the command was killed by {reason.removeprefix('signal:')}"


def _usage(files: int, size: int) -> str:
    return f"{files:,} file{'s' if files != 1 else ''}, {size:,} bytes"


def _limits(report: QuotaReport) -> str:
    return f"at most {report.quota.max_files:,} files and {report.quota.max_bytes:,} bytes"


def _quota_lines(report: QuotaReport, stopped: bool) -> list[str]:
    """What the quota check found and did, for a run that went over it."""
    lines = [] if stopped else [f"the workspace went over its quota ({_limits(report)})"]
    lines.append(f"before the command the workspace held {_usage(report.before.files, report.before.bytes)}")
    if report.removed:
        lines.append(
            f"removed {len(report.removed)} file{'s' if len(report.removed) != 1 else ''} this command "
            "created (newest first) to get back within the quota:"
        )
        lines += [f"  {path} ({size:,} bytes)" for path, size in report.removed[:MAX_LISTED_REMOVED]]
        if len(report.removed) > MAX_LISTED_REMOVED:
            lines.append(f"  …and {len(report.removed) - MAX_LISTED_REMOVED} more")
    if not report.complete:
        lines.append(
            "the workspace could not be counted completely (it holds more than "
            f"{sandbox_quota.MAX_WALK_ENTRIES:,} entries, directories and links included, or directories "
            f"nested more than {sandbox_quota.MAX_WALK_DEPTH} deep or unreadable): the numbers below are "
            "lower bounds; delete what is not needed"
        )
    if not report.removable:
        lines.append("nothing was removed: which files this command created cannot be told in this workspace")
    lines.append(f"the workspace now holds {_usage(report.after.files, report.after.bytes)}")
    if report.still_over:
        why = []
        if report.grown:
            grown = ", ".join(f"{p} ({b:,} -> {a:,} bytes)" for p, b, a in report.grown[:MAX_LISTED_REMOVED])
            why.append(f"files that existed before the command grew: {grown}")
        if report.before.over(report.limit):
            why.append("it was already over before the command")
        lines.append(
            "the workspace is still over its quota"
            + (f" ({'; '.join(why)})" if why else "")
            + "; delete or shrink files to make room"
        )
    return lines


class ShellExec(Tool):
    name = "shell_exec"
    description = (
        "Run a shell command (/bin/sh -c) in the session workspace, which is the working directory "
        "(/workspace). The command runs in a sandbox: only the workspace is writable, nothing else of "
        "the host is visible, there is normally no network (where an administrator allows it, HTTP "
        "and HTTPS to public hosts go through the proxy already set in HTTP_PROXY/HTTPS_PROXY), and "
        "CPU, memory, processes, file size, run time, output and the workspace's size are limited. Variables an administrator bound for this session (for "
        'example API tokens) are already set in the environment; use them by name ("$API_TOKEN"), '
        "their values are redacted from what you see. Returns the exit code, stdout, stderr and the "
        "files changed."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "minLength": 1, "description": "The shell command to run."},
            "timeout_seconds": {
                "type": "integer",
                "minimum": 1,
                "maximum": MAX_TIMEOUT_SECONDS,
                "description": "Stop the command after this many seconds (capped by the sandbox policy).",
            },
            "env": {
                "type": "object",
                "description": "Extra environment variables with plain values. Secrets cannot be "
                "referenced here: administrators bind them, and variables they bound cannot be overridden.",
                "additionalProperties": {"type": "string"},
                "maxProperties": 32,
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    }
    risk = Risk.EXTERNAL
    read_only = False
    idempotent = False

    def precheck(self, ctx: ToolContext, args: dict) -> None:
        problem = getattr(ctx, "env_problem", "")
        if problem:
            raise ToolError(f"shell_exec cannot run: {problem}", code="missing_secret")
        bound = sorted(set(args.get("env") or {}) & set(getattr(ctx, "env", None) or {}))
        if bound:
            raise ToolError(
                f"env sets {', '.join(bound)}, which an administrator bound for this session: it is "
                "already in the environment with the value they chose and cannot be overridden; "
                "leave it out of env",
                code="env_bound_by_admin",
            )

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        self.precheck(ctx, args)  # also when called without ToolService
        limits: SandboxLimits = getattr(ctx, "sandbox_limits", None) or DEFAULT_LIMITS
        if "timeout_seconds" in args:
            limits = dataclasses.replace(
                limits, wall_seconds=min(int(args["timeout_seconds"]), limits.wall_seconds)
            )
        env = {**args.get("env", {}), **(getattr(ctx, "env", None) or {})}  # what admins bound wins
        cancel = getattr(ctx, "cancel", None)
        if not isinstance(cancel, threading.Event):
            cancel = None

        quota_limits = WorkspaceQuota.from_settings()
        hand_back_connections()  # the command is a wait: the process's few connections serve others
        run = run_sandboxed(
            args["command"], ctx.workspace, limits, env=env, cancel=cancel, quota=quota_limits
        )
        for path, op in run.changed_files:
            ctx.port.file_changed(path, op)
        quota = run.quota if run.quota is not None and run.quota.exceeded else None
        for path, _ in quota.removed if quota else ():
            ctx.port.file_changed(path, "deleted")

        killed = _killed_message(run, limits)
        # A stopped run leads with why: error results are summarised from their first words.
        lines = [killed] if killed else []
        if quota:
            lines += _quota_lines(quota, stopped=killed is not None)
        lines.append(f"exit code: {run.exit_code} (took {_duration(run.duration_ms)})")
        if not run.sandboxed:
            lines.append(
                "note: ran WITHOUT the namespace sandbox (resource limits only), as the policy allows"
            )
        if run.exit_code != 0 and ("MemoryError" in run.stderr or "Cannot allocate memory" in run.stderr):
            lines.append(f"note: the memory limit is {limits.memory_mb} MB of address space per process")

        out_budget, err_budget = _split_budget(run.stdout, run.stderr)
        lines.append("stdout:" if run.stdout else "stdout: (empty)")
        if run.stdout:
            lines.append(_clip(run.stdout, out_budget).rstrip("\n"))
        lines.append("stderr:" if run.stderr else "stderr: (empty)")
        if run.stderr:
            lines.append(_clip(run.stderr, err_budget).rstrip("\n"))

        if run.changed_files:
            lines.append(f"changed files ({len(run.changed_files)}):")
            lines += [f"  {op} {path}" for path, op in run.changed_files[:MAX_LISTED_CHANGES]]
            if len(run.changed_files) > MAX_LISTED_CHANGES:
                lines.append(f"  …and {len(run.changed_files) - MAX_LISTED_CHANGES} more")
        if not run.changed_files_complete:
            lines.append("note: the workspace is too large to track every changed file")

        if run.timed_out:
            summary = f"timed out after {limits.wall_seconds} s"
        elif run.killed_reason:
            summary = f"killed ({run.killed_reason}) after {_duration(run.duration_ms)}"
        else:
            summary = f"exit {run.exit_code} in {_duration(run.duration_ms)}"
        if run.changed_files:
            n = len(run.changed_files)
            summary += f", {n} file{'s' if n != 1 else ''} changed"
        if quota:
            summary += f", over the workspace quota: {len(quota.removed)} removed"

        return ToolResult(
            content="\n".join(lines),
            summary=summary,
            # Over the quota is an error even when the command ended by itself: files it wrote may
            # be gone, and the workspace may be left full.
            is_error=run.killed_reason is not None or quota is not None,
            error_code="quota_exceeded" if quota else "tool_error",
            data={
                "exit_code": run.exit_code,
                "duration_ms": run.duration_ms,
                "timed_out": run.timed_out,
                "killed_reason": run.killed_reason,
                "stdout_truncated": run.stdout_truncated,
                "stderr_truncated": run.stderr_truncated,
                "sandboxed": run.sandboxed,
                "changed_files": [{"path": p, "op": op} for p, op in run.changed_files],
                "quota": run.quota.as_dict() if run.quota is not None else None,
            },
        )
