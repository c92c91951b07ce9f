"""The Session workspace on disk: where it lives, and which user paths may reach into it.

Owns the confinement rule for every native file tool (ARCHITECTURE §7): a path the model
names is relative to the workspace and must stay inside it after every symlink is followed.
Nothing here knows about Sessions beyond their ids; the runtime picks the root directory
(`settings.XAGENT_WORKSPACES_DIR`).
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from .base import ToolError

MAX_READ_BYTES = 1_000_000
MAX_WRITE_BYTES = 5_000_000

RESOLVE_STAGE = "resolve_path"

# Tenant slugs, numeric ids and UUIDs all match; anything else would let a caller choose
# where on disk a workspace lands.
_SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# A person names files through HTTP forms and headers: no C0/DEL/C1 controls, and none of the
# invisible characters that make a name read as something else (bidi overrides turn
# "invoice\u202etxt.html" into "invoicelmth.txt", zero-width spaces, line separators, BOM).
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _escape(user_path: str, why: str) -> ToolError:
    # The message quotes only what the model sent, never the host path or a symlink target.
    return ToolError(f"path {user_path!r} is refused: {why}", code="path_escape", stage=RESOLVE_STAGE)


def _root_of(workspace: Path) -> Path:
    root = Path(os.path.realpath(workspace))
    if not root.is_dir():
        raise ToolError("the session workspace does not exist", code="workspace_missing", stage=RESOLVE_STAGE)
    return root


def resolve_in_workspace(workspace: Path, user_path: str, *, must_exist: bool = False) -> Path:
    """Return the real (symlink-free) path `user_path` names inside `workspace`.

    Refuses with `path_escape` absolute paths, NUL bytes, and any path that ends up outside
    the workspace once `..` and every symlink on the way are followed — including for a
    file that does not exist yet, whose existing ancestors are resolved. `""` and `"."`
    name the workspace itself.
    """
    if not isinstance(user_path, str):
        raise ToolError("path must be a string", code="invalid_path", stage=RESOLVE_STAGE)
    if "\x00" in user_path:
        raise _escape(user_path, "it contains a NUL byte")
    if PurePosixPath(user_path).is_absolute():
        raise _escape(user_path, "absolute paths are not allowed; use a path relative to the workspace")

    root = _root_of(workspace)
    # Lexical check first, for a clear message on the common `../x` mistake.
    depth = 0
    for part in PurePosixPath(user_path).parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                raise _escape(user_path, "'..' leads outside the workspace")
        elif part != ".":
            depth += 1

    # realpath follows every symlink component in order (so `link/..` means what the kernel
    # means by it), and resolves the existing ancestors of a path that does not exist yet.
    try:
        resolved = Path(os.path.realpath(root / user_path))
        if not resolved.is_relative_to(root):
            raise _escape(user_path, "it resolves outside the workspace (through a symlink)")
        if must_exist and not resolved.exists():
            raise ToolError(f"{user_path!r} does not exist", code="not_found", stage=RESOLVE_STAGE)
    except OSError as exc:  # a name over the file system's limits (ENAMETOOLONG), a loop, ...
        raise ToolError(
            f"path {user_path[:200]!r} is not usable: {exc.strerror or exc}",
            code="invalid_path",
            stage=RESOLVE_STAGE,
        ) from None
    return resolved


def relative_posix(workspace: Path, path: Path) -> str:
    """`path` (already resolved inside `workspace`) as the POSIX path the model and UI use."""
    rel = path.relative_to(_root_of(workspace)).as_posix()
    return rel if rel else "."


def workspace_for(root: Path, tenant_slug_or_id: str | int, session_id: object) -> Path:
    """Create (if needed) and return `<root>/<tenant>/<session>/`."""
    parts = [str(tenant_slug_or_id), str(session_id)]
    for part in parts:
        if not _SAFE_COMPONENT.match(part) or ".." in part:
            raise ValueError(f"unsafe workspace path component: {part!r}")
    path = Path(root).joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _entry(rel: str, st: os.stat_result, kind: str) -> dict:
    return {
        "path": rel,
        "size": st.st_size if kind == "file" else 0,
        "modified_at": datetime.fromtimestamp(st.st_mtime, tz=UTC).isoformat(),
        "kind": kind,
    }


def list_tree(workspace: Path, under: str = "", *, max_entries: int | None = None) -> list[dict]:
    """Files and directories under `under` (default: the whole workspace), recursively.

    Each entry is `{path, size, modified_at, kind}` with `path` relative to the workspace
    root, entries sorted by path. Symlinks that point outside the workspace (or nowhere)
    are skipped; symlinks that stay inside are listed as what they point to but never
    descended into, so a link cycle cannot loop. With `max_entries` the walk stops once
    that many entries are collected (the result is then a sorted prefix of the walk).
    """
    root = _root_of(workspace)
    start = resolve_in_workspace(root, under or ".", must_exist=True)
    entries: list[dict] = []

    if not start.is_dir():
        entries.append(_entry(relative_posix(root, start), start.stat(), "file"))
        return entries

    stack = [start]
    while stack:
        directory = stack.pop()
        try:
            children = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue  # unreadable or vanished mid-walk: list what we can
        for child in children:
            if max_entries is not None and len(entries) >= max_entries:
                return sorted(entries, key=lambda e: e["path"])
            rel = (Path(child.path).relative_to(root)).as_posix()
            try:
                if child.is_symlink():
                    target = Path(os.path.realpath(child.path))
                    if not target.is_relative_to(root) or not target.exists():
                        continue
                    st = target.stat()
                    kind = "dir" if target.is_dir() else "file"
                    entries.append(_entry(rel, st, kind))
                elif child.is_dir(follow_symlinks=False):
                    entries.append(_entry(rel, child.stat(follow_symlinks=False), "dir"))
                    stack.append(Path(child.path))
                elif child.is_file(follow_symlinks=False):
                    entries.append(_entry(rel, child.stat(follow_symlinks=False), "file"))
            except OSError:
                continue
    return sorted(entries, key=lambda e: e["path"])


# --- a person's own file operations (the files API) -------------------------------------------


class WorkspaceLimitExceeded(ToolError):
    """An upload would pass a workspace limit; `status` is the HTTP status the API answers."""

    def __init__(self, message: str, *, code: str, status: int, details: dict):
        super().__init__(message, code=code)
        self.status, self.details = status, details


def workspace_usage(workspace: Path, *, stop_after_files: int | None = None) -> tuple[int, int]:
    """(files, bytes) in the workspace, symlinks not followed; stops counting past `stop_after_files`."""
    root = _root_of(workspace)
    files = size = 0
    stack = [root]
    while stack:
        try:
            children = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for child in children:
            try:
                if child.is_dir(follow_symlinks=False):
                    stack.append(Path(child.path))
                elif child.is_file(follow_symlinks=False):
                    files += 1
                    size += child.stat(follow_symlinks=False).st_size
            except OSError:
                continue
            if stop_after_files is not None and files > stop_after_files:
                return files, size
    return files, size


# The workspace folder where a Session's loaded Skills appear (tools_app/native/files.py), read-only:
# nothing is written there, by the agent or a person, so nothing there can pass for a Skill's file.
SKILLS_FOLDER = "skills"


def in_skills_folder(path: str) -> bool:
    """Whether a workspace-relative path (as typed, or resolved) is `skills` or inside it."""
    norm = posixpath.normpath(path.strip().replace("\\", "/"))
    return not norm.startswith("/") and norm.split("/")[0] == SKILLS_FOLDER


# The longest file name (in bytes) Linux file systems take.
MAX_NAME_BYTES = 255


def fit_file_name(name: str) -> str:
    """`name` cut to MAX_NAME_BYTES of UTF-8 (at a character boundary), its extension kept: a
    name of 200 "é" is 400 bytes, though within Django's 255 characters."""
    if len(name.encode()) <= MAX_NAME_BYTES:
        return name
    stem, dot, suffix = name.rpartition(".")
    if not dot or not stem or len(suffix.encode()) > 16:
        stem, suffix = name, ""
    tail = f".{suffix}" if suffix else ""
    room = MAX_NAME_BYTES - len(tail.encode())
    return stem.encode()[:room].decode(errors="ignore") + tail


def upload_destination(workspace: Path, file_name: str, user_path: str | None) -> Path:
    """Where an uploaded file lands: `user_path` (a directory when it ends in "/") or its own
    name, shortened to what the file system takes."""
    name = fit_file_name(PurePosixPath(file_name.replace("\\", "/")).name)
    if not name or name in (".", ".."):
        raise ToolError("the uploaded file has no usable name; give a `path`", code="invalid_path")
    for text in (name, user_path or ""):
        if CONTROL_CHARACTERS.search(text):
            raise ToolError(
                f"{text[:200]!r} holds a control or invisible formatting character; file names may not",
                code="invalid_path",
            )
    target = user_path.strip() if user_path else ""
    if not target:
        target = name
    elif target.endswith("/"):
        target = target + name
    path = resolve_in_workspace(workspace, target)
    if in_skills_folder(target) or in_skills_folder(relative_posix(workspace, path)):
        raise ToolError(
            f"{target[:200]!r} is in {SKILLS_FOLDER}/, where the agent sees its loaded skills "
            "(read-only); upload it somewhere else",
            code="reserved_path",
        )
    if path == _root_of(workspace) or path.is_dir():
        raise ToolError(
            f"{target!r} is a directory; end the path with '/' to upload into it", code="is_a_directory"
        )
    return path


def save_upload(
    workspace: Path,
    path: Path,
    chunks,
    *,
    size: int,
    max_bytes: int,
    max_files: int,
    max_workspace_bytes: int,
) -> str:
    """Write an uploaded file at `path` (already resolved inside `workspace`) atomically, within
    the limits. Returns "created" or "modified"."""
    if size > max_bytes:
        raise WorkspaceLimitExceeded(
            f"the file is {size:,} bytes, over the {max_bytes:,}-byte upload limit",
            code="file_too_large",
            status=413,
            details={"size": size, "limit_bytes": max_bytes},
        )
    existed = path.is_file()
    replaced = path.stat().st_size if existed else 0
    files, used = workspace_usage(workspace, stop_after_files=max_files)
    if not existed and files >= max_files:
        # Counting stops past the limit: `files` is a lower bound when it exceeds it.
        raise WorkspaceLimitExceeded(
            f"the workspace already holds {'more than ' if files > max_files else ''}{max_files:,} files, "
            "its limit; delete some first",
            code="too_many_files",
            status=400,
            details={"files": files, "limit_files": max_files},
        )
    if used - replaced + size > max_workspace_bytes:
        raise WorkspaceLimitExceeded(
            f"the workspace would hold {used - replaced + size:,} bytes, over its {max_workspace_bytes:,}-byte limit",
            code="workspace_full",
            status=413,
            details={"used_bytes": used, "size": size, "limit_bytes": max_workspace_bytes},
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    # A short temporary name: a legal 255-byte file name plus a prefix would not fit.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".upload-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            for chunk in chunks:
                fh.write(chunk)
        os.chmod(tmp, 0o644)
        # rename replaces the directory entry itself, so it never writes through a link.
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return "modified" if existed else "created"


def copy_file(source_workspace: Path, source_path: str, workspace: Path, target_path: str, **limits) -> str:
    """Copy one regular file from another workspace (a delegated task's files, a sub-Session's
    results) to `target_path` here: both paths confined like any other (`path_escape`), the
    target kept out of the skills folder, and the upload limits (`save_upload`'s keyword
    arguments) applied. Returns "created" or "modified"."""
    source = resolve_in_workspace(source_workspace, source_path, must_exist=True)
    if not source.is_file():
        raise ToolError(f"{source_path!r} is not a file", code="not_a_file", stage=RESOLVE_STAGE)
    if in_skills_folder(target_path):
        raise ToolError(f"{target_path!r} is in {SKILLS_FOLDER}/, which is read-only", code="reserved_path")
    target = resolve_in_workspace(workspace, target_path)
    if target.is_dir():
        raise ToolError(f"{target_path!r} is a directory", code="is_a_directory")
    # O_NOFOLLOW: the file read is the one resolved above, not a link swapped in since.
    fd = os.open(source, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        return save_upload(workspace, target, iter(lambda: fh.read(1 << 16), b""), size=size, **limits)


def delete_path(workspace: Path, user_path: str) -> tuple[str, str]:
    """Delete a file, a symlink or a directory tree; returns (workspace-relative path, kind)."""
    root = _root_of(workspace)
    if "\x00" in user_path:
        raise _escape(user_path, "it contains a NUL byte")
    # Resolve the parent only: deleting a symlink removes the link, never what it points to.
    parent = resolve_in_workspace(root, str(PurePosixPath(user_path).parent) or ".", must_exist=True)
    name = PurePosixPath(user_path).name
    if name in ("", ".", "..") or (parent == root and not name):
        raise ToolError("the workspace itself cannot be deleted", code="invalid_path", stage=RESOLVE_STAGE)
    target = parent / name
    if not os.path.lexists(target):
        raise ToolError(f"{user_path!r} does not exist", code="not_found", stage=RESOLVE_STAGE)
    rel = target.relative_to(root).as_posix()
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
        return rel, "dir"
    target.unlink()
    return rel, "file"
