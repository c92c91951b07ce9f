"""Workspace quotas against the sandbox: what one sandboxed run may add to its workspace.

Owns how a `run_sandboxed` command is held to the workspace limits (XAGENT_WORKSPACE_MAX_BYTES,
XAGENT_WORKSPACE_MAX_FILES; ARCHITECTURE §7: "workspace quotas count what the sandbox writes").
The workspace is counted as uploads count it (`tools_app.workspace.workspace_usage`): regular
files and their sizes, symlinks and directories not counted, so the files API (uploads, copies
from delegated Sessions) and the sandbox agree on one number.

- Before the run, `QuotaWatch` records the baseline: the workspace's usage and which regular
  files exist (path, inode, size).
- While it runs, the supervising loop calls the watch (`QuotaWatch.__call__`); at most every
  CHECK_SECONDS, and never for more than 1/THROTTLE of the time, it walks the workspace, stopping
  as soon as the count is over the allowance. Once over, the loop stops the command with
  killed_reason "quota_exceeded".
- When the run has ended (before the after-walk that yields `changed_files`, so those describe
  the final state), `QuotaWatch.finish` counts again; if the workspace is over its allowance it
  removes files this run created, newest first, until it is back within, and returns what it
  found and did (`QuotaReport`).

**The allowance** is, per limit, the larger of the limit and the baseline: a run may not take a
workspace over a limit, nor leave one that already was (a lowered limit, a grown file) further
over; it may always shrink one (so `rm` still works in a full workspace).

**Never removed**: a file that existed before the run, by path (also when the run rewrote it
under the same name) or by inode (when the run renamed or hard-linked it); a file not owned by
the run's uid when the caller names it (a person's upload while the command ran: uploads are
written by the worker); anything at all when the baseline walk was incomplete (we cannot tell
what the run created). A pre-existing file the run grew stays: the report lists it and says the
workspace is still over its quota.

**A workspace too big to count** (more than MAX_WALK_ENTRIES entries of any kind, directories
nested deeper than MAX_WALK_DEPTH, or unreadable ones) has a count that is only a lower bound,
and what is beyond it could hold anything. A run that makes a countable workspace so is over its
quota like one that writes too much: stopped while running, and an error at the end. Its
directories are not removed (only regular files are), so later runs there count lower bounds
and remove nothing until someone deletes the excess.

**Why newest first** (not largest first): what a runaway command writes after it reached the
quota is its newest files, and the file it was writing when stopped is a partial one; removing
newest first puts the workspace back to about what the command had written when it reached the
quota, which is easy to explain and keeps its earliest (usually complete) results. Largest first
would keep a truncated last file and could drop a large result written early for a flood of
small ones. Ties (coarse timestamps) go by path, so the choice is deterministic. The command can
set its own files' times, which changes only which of its own files go.

Walks go by directory fds, each subdirectory opened O_NOFOLLOW relative to its parent, like
`process._snapshot`: a symlink the sandbox planted (or swapped in mid-walk) never leads a count
or a removal out of the workspace, and a removal re-checks the inode it is about to unlink.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from django.conf import settings

# Seconds between two usage walks while a command runs, at least.
CHECK_SECONDS = 0.5
# A walk that took t seconds is not followed by another for THROTTLE * t: walking costs a
# running command at most 1/THROTTLE of one core, however large the workspace.
THROTTLE = 10
# Entries (of any kind) one walk looks at; as `process.SNAPSHOT_MAX_ENTRIES`. A workspace
# within its file limit has far fewer; past this the count is a lower bound.
MAX_WALK_ENTRIES = 100_000
# Directories nested deeper than this are not counted (the walk holds one level's fds each).
MAX_WALK_DEPTH = 100


@dataclass(frozen=True)
class WorkspaceQuota:
    max_bytes: int
    max_files: int

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_files"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")

    @classmethod
    def from_settings(cls) -> WorkspaceQuota:
        """The limits uploads use (read at call time, so a changed setting applies at once)."""
        return cls(
            max_bytes=settings.XAGENT_WORKSPACE_MAX_BYTES, max_files=settings.XAGENT_WORKSPACE_MAX_FILES
        )


@dataclass(frozen=True)
class Usage:
    files: int = 0
    bytes: int = 0

    def over(self, limit: Usage) -> bool:
        return self.files > limit.files or self.bytes > limit.bytes

    def as_dict(self) -> dict:
        return {"files": self.files, "bytes": self.bytes}


@dataclass
class QuotaReport:
    """What the quota check of one run found and did."""

    quota: WorkspaceQuota
    before: Usage  # when the run started
    after: Usage  # when it ended, after any removal
    # The run took the workspace over its allowance (stopped while running, or found at the end).
    exceeded: bool = False
    stopped: bool = False  # stopped while running (killed_reason "quota_exceeded")
    # Files this run created that were removed, newest first: (path, size).
    removed: list[tuple[str, int]] = field(default_factory=list)
    # Files that existed before the run and grew: (path, size before, size after).
    grown: list[tuple[str, int, int]] = field(default_factory=list)
    # Counting was incomplete (a workspace too big to count, module docstring): lower bounds.
    complete: bool = True
    # Whether the files this run created could be told apart (the baseline walk was complete);
    # when not, nothing is removed.
    removable: bool = True

    @property
    def limit(self) -> Usage:
        return Usage(self.quota.max_files, self.quota.max_bytes)

    @property
    def still_over(self) -> bool:
        """The workspace is over its limits as the run left it (after any removal)."""
        return self.after.over(self.limit)

    def as_dict(self) -> dict:
        return {
            "exceeded": self.exceeded,
            "stopped": self.stopped,
            "max_bytes": self.quota.max_bytes,
            "max_files": self.quota.max_files,
            "before": self.before.as_dict(),
            "after": self.after.as_dict(),
            "still_over": self.still_over,
            "removed": [{"path": p, "size": s} for p, s in self.removed],
            "grown": [{"path": p, "size_before": b, "size_after": a} for p, b, a in self.grown],
            "complete": self.complete,
            "removable": self.removable,
        }


# --- walking by directory fds ----------------------------------------------------------------

Visit = Callable[[int, str, str, os.stat_result], bool]


def walk(root_fd: int, visit: Visit, *, max_entries: int | None = None) -> bool:
    """Call `visit(dir_fd, name, rel, st)` for every entry under the directory `root_fd`
    (directories included, before their contents), with `st` from lstat: never following a
    symlink, and opening each subdirectory with O_NOFOLLOW relative to its parent. Stops when
    `visit` returns True.

    Returns whether every entry was visited: False when stopped, past `max_entries`
    (MAX_WALK_ENTRIES unless given), or when a directory could not be read or is nested deeper
    than MAX_WALK_DEPTH. Depth first, holding open only the directories on the current path (two
    fds each), so a wide or deep tree cannot exhaust this process's fds. An entry that vanished
    or was swapped for a symlink mid-walk is skipped (the sandbox may still be running)."""
    max_entries = MAX_WALK_ENTRIES if max_entries is None else max_entries
    seen = 0
    complete = True
    stack: list[tuple[int, str, Iterator[os.DirEntry]]] = []

    def enter(dir_fd: int, prefix: str) -> bool:
        try:
            entries = os.scandir(dir_fd)  # iterates a dup of dir_fd
        except OSError:
            os.close(dir_fd)
            return False
        stack.append((dir_fd, prefix, entries))
        return True

    if not enter(os.dup(root_fd), ""):
        return False
    try:
        while stack:
            dir_fd, prefix, entries = stack[-1]
            try:
                name = next(entries).name
            except (StopIteration, OSError) as exc:
                complete = complete and isinstance(exc, StopIteration)
                stack.pop()
                entries.close()
                os.close(dir_fd)
                continue
            seen += 1
            if seen > max_entries:
                return False
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue  # gone since it was listed
            rel = prefix + name
            if visit(dir_fd, name, rel, st):
                return False
            if not stat.S_ISDIR(st.st_mode):
                continue
            if len(stack) > MAX_WALK_DEPTH:
                complete = False
                continue
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
            except (FileNotFoundError, NotADirectoryError):
                continue  # gone, or no longer a directory
            except OSError as exc:
                # ELOOP: swapped for a symlink since the stat (skipped like a symlink); anything
                # else (EACCES, EMFILE) leaves a subtree uncounted.
                complete = complete and exc.errno == errno.ELOOP
                continue
            complete = enter(sub, rel + "/") and complete
    finally:
        for dir_fd, _, entries in stack:
            entries.close()
            os.close(dir_fd)
    return complete


@dataclass(frozen=True)
class _File:
    dev: int
    ino: int
    size: int
    mtime_ns: int
    uid: int


def _regular_files(root_fd: int) -> tuple[dict[str, _File], bool]:
    files: dict[str, _File] = {}

    def visit(dir_fd: int, name: str, rel: str, st: os.stat_result) -> bool:
        if stat.S_ISREG(st.st_mode):
            files[rel] = _File(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_uid)
        return False

    complete = walk(root_fd, visit)
    return files, complete


def _usage(files: dict[str, _File]) -> Usage:
    return Usage(len(files), sum(f.size for f in files.values()))


def _open_parent(root_fd: int, rel: str) -> tuple[int, str]:
    """An fd of the directory holding `rel` (opened component by component, O_NOFOLLOW), and
    the entry's name in it."""
    *dirs, name = rel.split("/")
    fd = os.dup(root_fd)
    try:
        for part in dirs:
            sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = sub
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def _remove(root_fd: int, rel: str, expected: _File) -> bool:
    """Unlink `rel` if it is still the regular file the walk saw (same inode)."""
    try:
        dir_fd, name = _open_parent(root_fd, rel)
    except OSError:
        return False
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (expected.dev, expected.ino):
            return False
        os.unlink(name, dir_fd=dir_fd)
        return True
    except OSError:
        return False
    finally:
        os.close(dir_fd)


# --- one run -------------------------------------------------------------------------------


class QuotaWatch:
    """The quota check of one run, from its baseline (taken here, just before the run starts)
    to `finish`. `root_fd` is the workspace directory, held open by the caller throughout.
    `owner_uid`, when given, is the uid the run's processes write as: only files it owns are
    the run's to remove."""

    def __init__(self, root_fd: int, quota: WorkspaceQuota, *, owner_uid: int | None = None):
        self.root_fd = root_fd
        self.quota = quota
        self.owner_uid = owner_uid
        self.baseline, self.baseline_complete = _regular_files(root_fd)
        self.before = _usage(self.baseline)
        self.allowance = Usage(
            max(quota.max_files, self.before.files), max(quota.max_bytes, self.before.bytes)
        )
        self._inodes = {(f.dev, f.ino) for f in self.baseline.values()}
        self.stopped = False
        self.checks = 0
        self._next_check = time.monotonic() + CHECK_SECONDS

    def __call__(self) -> bool:
        """For the supervising loop, on every round: True once the run is over its allowance
        (and from then on); walks only when a check is due."""
        if self.stopped:
            return True
        started = time.monotonic()
        if started < self._next_check:
            return False
        self.checks += 1
        over = self._over_now()
        took = time.monotonic() - started
        self._next_check = time.monotonic() + max(CHECK_SECONDS, THROTTLE * took)
        self.stopped = over
        return over

    def _over_now(self) -> bool:
        files = size = 0
        over = False

        def visit(dir_fd: int, name: str, rel: str, st: os.stat_result) -> bool:
            nonlocal files, size, over
            if stat.S_ISREG(st.st_mode):
                files += 1
                size += st.st_size
                over = files > self.allowance.files or size > self.allowance.bytes
            return over

        complete = walk(self.root_fd, visit)
        # Past MAX_WALK_ENTRIES what is left is not counted: when the workspace was countable
        # before the run, the run made it uncountable (a flood of directories or links), which
        # no quota could then hold. Stop it like any other excess.
        return over or (not complete and self.baseline_complete)

    def finish(self) -> QuotaReport:
        """Count the workspace the run left; when over the allowance, remove the files this run
        created, newest first, until it is back within (or none is left to remove)."""
        files, complete = _regular_files(self.root_fd)
        usage = _usage(files)
        # Countable before, not after: this run made it so (see `_over_now`).
        uncountable = self.baseline_complete and not complete
        report = QuotaReport(
            quota=self.quota,
            before=self.before,
            after=usage,
            exceeded=self.stopped or usage.over(self.allowance) or uncountable,
            stopped=self.stopped,
            complete=complete and self.baseline_complete,
            removable=self.baseline_complete,
        )
        if usage.over(self.allowance) and self.baseline_complete:
            count, size = usage.files, usage.bytes
            for rel, found in self._created_newest_first(files):
                if not Usage(count, size).over(self.allowance):
                    break
                if _remove(self.root_fd, rel, found):
                    report.removed.append((rel, found.size))
                    count, size = count - 1, size - found.size
            report.after = Usage(count, size)
        if report.exceeded:
            report.grown = sorted(
                (rel, self.baseline[rel].size, f.size)
                for rel, f in files.items()
                if rel in self.baseline and f.size > self.baseline[rel].size
            )
        return report

    def _created_newest_first(self, files: dict[str, _File]) -> list[tuple[str, _File]]:
        created = [
            (rel, f)
            for rel, f in files.items()
            if rel not in self.baseline
            and (f.dev, f.ino) not in self._inodes
            and (self.owner_uid is None or f.uid == self.owner_uid)
        ]
        created.sort(key=lambda item: (item[1].mtime_ns, item[0]), reverse=True)
        return created
