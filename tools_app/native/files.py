"""Native file tools over the Session workspace: fs_list, fs_read, fs_write, fs_edit, fs_delete_files.

Every path goes through `resolve_in_workspace` (the confinement rule lives there, not here).
Tools that change a file report it through `ctx.port.file_changed(path, op)`, which is how the
`file.changed` event reaches the Session's log; the path reported is the workspace-relative
path of the file actually changed.
"""

from __future__ import annotations

import os
import posixpath
import stat
import tempfile
from pathlib import Path

from approvals_app.choices import Risk

from ..base import Tool, ToolContext, ToolError, ToolResult
from ..workspace import (
    MAX_READ_BYTES,
    MAX_WRITE_BYTES,
    SKILLS_FOLDER,
    in_skills_folder,
    list_tree,
    relative_posix,
    resolve_in_workspace,
)

DEFAULT_READ_LINES = 2000
MAX_LINE_CHARS = 2000
# Below ToolService.MAX_RESULT_CHARS, so fs_read ends on a whole line with a "continue at" hint
# instead of being cut mid-line by the generic cap.
MAX_READ_OUTPUT_CHARS = 16_000
MAX_LIST_ENTRIES = 1000
MAX_DELETE_PATHS = 100


def _human_size(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.1f} MB"


def _os_error(action: str, user_path: str, exc: OSError) -> ToolError:
    # strerror only: the exception's filename would show the host path.
    return ToolError(f"could not {action} {user_path!r}: {exc.strerror or exc}", code="os_error")


def _read_text(path: Path, user_path: str) -> str:
    """The file's text, refusing directories, oversized files, binary and non-UTF-8 content."""
    if path.is_dir():
        raise ToolError(f"{user_path!r} is a directory; use fs_list", code="is_a_directory")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_READ_BYTES:
                raise ToolError(
                    f"{user_path!r} is {_human_size(size)}, over the {MAX_READ_BYTES:,}-byte limit of the file tools",
                    code="too_large",
                )
            data = fh.read(MAX_READ_BYTES + 1)
    except OSError as exc:
        raise _os_error("read", user_path, exc) from exc
    return _decode(data, user_path)


def _decode(data: bytes, user_path: str) -> str:
    if len(data) > MAX_READ_BYTES:
        raise ToolError(f"{user_path!r} is over the {MAX_READ_BYTES:,}-byte limit", code="too_large")
    if b"\x00" in data[:8192]:
        raise ToolError(
            f"{user_path!r} looks like a binary file; fs_read only reads text", code="binary_file"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ToolError(
            f"{user_path!r} is not UTF-8 text (binary or another encoding; first bad byte at offset {exc.start})",
            code="binary_file",
        ) from exc


# --- loaded Skills' resources: read-only under skills/<name>/ ---------------------------------
#
# `skills/` of the workspace shows the Session's loaded Skills and nothing else: their files are
# read from the Skill (never written to disk), and nothing is written there (by a tool or a
# person's upload), so nothing can pass for a Skill's file.


def _skill_path(user_path: str) -> tuple[str, str] | None:
    """(Skill name, path inside it; name "" for the folder itself) when `user_path` is in skills/."""
    if not in_skills_folder(user_path):
        return None
    parts = posixpath.normpath(user_path.strip().replace("\\", "/")).split("/")
    return (parts[1] if len(parts) > 1 else ""), "/".join(parts[2:])


def _refuse_skill_write(user_path: str) -> None:
    if in_skills_folder(user_path):
        raise ToolError(
            f"{user_path!r} is in {SKILLS_FOLDER}/, where loaded skills appear read-only; write your "
            "version to another path",
            code="read_only",
        )


class _WritesFiles:
    """Tools that write, edit or delete files refuse skills/ at ToolService's `precheck`, before
    approval is asked (every call, approved ones included, passes that stage before it runs)."""

    path_arguments = ("path",)

    def precheck(self, ctx: ToolContext, args: dict) -> None:
        for name in self.path_arguments:
            value = args.get(name)
            for path in value if isinstance(value, list) else [value] if isinstance(value, str) else []:
                _refuse_skill_write(path)


def _loaded_skill(ctx: ToolContext, name: str, user_path: str) -> str:
    loaded = ctx.port.loaded_skill_names()
    if name not in loaded:
        shown = ", ".join(loaded) if loaded else "none yet"
        raise ToolError(
            f"{user_path!r}: {SKILLS_FOLDER}/ shows only the skills loaded in this session ({shown}); "
            "load one with skills_load to read its files",
            code="not_found",
        )
    return name


def _skill_entries(ctx: ToolContext, name: str, under: str) -> list[dict]:
    from skills_app.catalog import loaded

    entries = []
    for skill in loaded(ctx.tenant_id, [name]):
        for path, size in (("SKILL.md", skill.skill_md_size), *skill.resources):
            if not under or path == under or path.startswith(under.rstrip("/") + "/"):
                entries.append(
                    {
                        "path": f"{SKILLS_FOLDER}/{skill.name}/{path}",
                        "kind": "file",
                        "size": size,
                        "skill": skill.name,
                    }
                )
    return entries


def _list_skills(ctx: ToolContext, under: str) -> list[dict]:
    name, inner = _skill_path(under)
    if not name:
        return [
            e for loaded_name in ctx.port.loaded_skill_names() for e in _skill_entries(ctx, loaded_name, "")
        ]
    entries = _skill_entries(ctx, _loaded_skill(ctx, name, under), inner)
    if not entries:
        raise ToolError(f"skill {name} has no file or folder {inner!r}", code="not_found")
    return entries


def _read_skill_text(ctx: ToolContext, name: str, path: str, user_path: str) -> str:
    from skills_app.catalog import ResourceNotFound, read_resource

    if not name:
        raise ToolError(f"{user_path!r} is a directory; use fs_list", code="is_a_directory")
    _loaded_skill(ctx, name, user_path)
    try:
        data = read_resource(ctx.tenant_id, name, path)
    except ResourceNotFound as exc:
        if not path or _skill_entries(ctx, name, path):
            raise ToolError(
                f"{user_path!r} is a folder of skill {name}; use fs_list", code="is_a_directory"
            ) from exc
        raise ToolError(
            f"skill {name} has no file {path!r}; fs_list path='skills/{name}' lists its files",
            code="not_found",
        ) from exc
    return _decode(data, user_path)


def _write_text(path: Path, user_path: str, content: str) -> str:
    """Write `content` atomically (temp file + rename); return "created" or "modified"."""
    data = content.encode("utf-8")
    if len(data) > MAX_WRITE_BYTES:
        raise ToolError(
            f"content is {_human_size(len(data))}, over the {MAX_WRITE_BYTES:,}-byte write limit",
            code="too_large",
        )
    if path.is_dir():
        raise ToolError(f"{user_path!r} is a directory", code="is_a_directory")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = stat.S_IMODE(path.stat().st_mode) if existed else None
        # A short temporary name: a legal 255-byte file name plus a prefix would not fit.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".write-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            if mode is not None:
                os.chmod(tmp, mode)
            # rename replaces the directory entry itself, so it never writes through a link.
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise _os_error("write", user_path, exc) from exc
    return "modified" if existed else "created"


class FsList(Tool):
    name = "fs_list"
    description = (
        "List files and directories in the session workspace, recursively. Paths are relative to the "
        "workspace root; directories end with '/'. Optional `path` limits the listing to a subdirectory."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "description": "Directory relative to the workspace root (default: root).",
            }
        },
        "additionalProperties": False,
    }
    risk = Risk.READ
    read_only = True
    idempotent = True

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        under = args.get("path") or "."
        if in_skills_folder(under):
            entries = _list_skills(ctx, under)
        else:
            entries = list_tree(ctx.workspace, under, max_entries=MAX_LIST_ENTRIES + 1)
            if posixpath.normpath(under.strip() or ".") == ".":
                # skills/ shows the loaded skills (read-only), whatever the disk holds there.
                entries = [e for e in entries if not in_skills_folder(e["path"])] + _list_skills(
                    ctx, SKILLS_FOLDER
                )
        truncated = len(entries) > MAX_LIST_ENTRIES
        entries = entries[:MAX_LIST_ENTRIES]
        if not entries:
            where = "the workspace" if under in ("", ".") else repr(under)
            return ToolResult(content=f"{where} is empty", summary=f"listed {under}: empty")
        lines = [
            f"{e['path']}/"
            if e["kind"] == "dir"
            else f"{e['path']}  ({_human_size(e['size'])}{', read-only skill file' if e.get('skill') else ''})"
            for e in entries
        ]
        if truncated:
            lines.append(f"…[listing stopped at {MAX_LIST_ENTRIES} entries; list a subdirectory to see more]")
        files = sum(1 for e in entries if e["kind"] == "file")
        return ToolResult(
            content="\n".join(lines),
            summary=f"listed {under}: {files} files, {len(entries) - files} directories",
            data={"entries": entries, "truncated": truncated},
        )


class FsRead(Tool):
    name = "fs_read"
    description = (
        "Read a UTF-8 text file from the workspace. Output lines are prefixed with their line number. "
        "Use `offset` (1-based first line) and `limit` (number of lines) to page through long files."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "minLength": 1,
                "description": "File path relative to the workspace root.",
            },
            "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based)."},
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": 10_000,
                "description": "Max lines to return.",
            },
        },
        "required": ["path"],
        "additionalProperties": False,
    }
    risk = Risk.READ
    read_only = True
    idempotent = True

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        user_path = args["path"]
        skill = _skill_path(user_path)
        if skill is not None:
            text = _read_skill_text(ctx, *skill, user_path)
            rel = f"{SKILLS_FOLDER}/{skill[0]}/{skill[1]}"
        else:
            path = resolve_in_workspace(ctx.workspace, user_path, must_exist=True)
            text = _read_text(path, user_path)
            rel = relative_posix(ctx.workspace, path)
        if text == "":
            return ToolResult(content=f"({rel} is empty)", summary=f"read {rel}: empty")

        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        total = len(lines)
        first = args.get("offset", 1)
        limit = args.get("limit", DEFAULT_READ_LINES)
        if first > total:
            raise ToolError(f"offset {first} is past the end of {rel} ({total} lines)", code="bad_offset")

        out: list[str] = []
        used = 0
        last = first - 1
        for number in range(first, min(total, first + limit - 1) + 1):
            line = lines[number - 1].removesuffix("\r")
            if len(line) > MAX_LINE_CHARS:
                line = (
                    line[:MAX_LINE_CHARS] + f"…[line truncated: {len(line) - MAX_LINE_CHARS} more characters]"
                )
            rendered = f"{number:>6}\t{line}"
            if out and used + len(rendered) + 1 > MAX_READ_OUTPUT_CHARS:
                break
            out.append(rendered)
            used += len(rendered) + 1
            last = number
        if last < total:
            out.append(
                f"…[lines {first}-{last} of {total} shown; call fs_read with offset={last + 1} to continue]"
            )
        return ToolResult(
            content="\n".join(out),
            summary=f"read {rel} (lines {first}-{last} of {total})",
            data={"path": rel, "first_line": first, "last_line": last, "total_lines": total},
        )


class FsWrite(_WritesFiles, Tool):
    name = "fs_write"
    description = (
        "Create or overwrite a text file in the workspace with `content`. Parent directories are created. "
        "To change part of an existing file prefer fs_edit."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "minLength": 1,
                "description": "File path relative to the workspace root.",
            },
            "content": {"type": "string", "description": "The complete new content of the file."},
        },
        "required": ["path", "content"],
        "additionalProperties": False,
    }
    risk = Risk.WRITE
    read_only = False
    # The whole content is given: writing it again leaves the same file (recovery may re-run it).
    idempotent = True

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        user_path, content = args["path"], args["content"]
        path = resolve_in_workspace(ctx.workspace, user_path)
        op = _write_text(path, user_path, content)
        rel = relative_posix(ctx.workspace, path)
        ctx.port.file_changed(rel, op)
        size = _human_size(len(content.encode("utf-8")))
        return ToolResult(
            content=f"{op} {rel} ({size})", summary=f"{op} {rel} ({size})", data={"path": rel, "op": op}
        )


class FsEdit(_WritesFiles, Tool):
    name = "fs_edit"
    description = (
        "Replace `old_text` with `new_text` in a workspace file. `old_text` must match exactly (including "
        "whitespace) and, unless `replace_all` is true, occur exactly once; include surrounding lines to make "
        "it unique."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "path": {
                "type": "string",
                "minLength": 1,
                "description": "File path relative to the workspace root.",
            },
            "old_text": {"type": "string", "minLength": 1, "description": "Exact text to replace."},
            "new_text": {"type": "string", "description": "Replacement text."},
            "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."},
        },
        "required": ["path", "old_text", "new_text"],
        "additionalProperties": False,
    }
    risk = Risk.WRITE
    read_only = False
    idempotent = False

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        user_path, old, new = args["path"], args["old_text"], args["new_text"]
        replace_all = args.get("replace_all", False)
        path = resolve_in_workspace(ctx.workspace, user_path, must_exist=True)
        text = _read_text(path, user_path)
        rel = relative_posix(ctx.workspace, path)
        if old == new:
            raise ToolError("old_text and new_text are identical; nothing to change", code="edit_no_change")
        count = text.count(old)
        if count == 0:
            raise ToolError(
                f"old_text was not found in {rel}; read the file and copy the text exactly (whitespace matters)",
                code="edit_not_found",
            )
        if count > 1 and not replace_all:
            raise ToolError(
                f"old_text occurs {count} times in {rel}; include more surrounding text to make it unique, "
                "or set replace_all to true",
                code="edit_ambiguous",
            )
        first_line = text.count("\n", 0, text.index(old)) + 1
        updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        _write_text(path, user_path, updated)
        ctx.port.file_changed(rel, "modified")
        what = f"{count} occurrences" if count > 1 else f"1 occurrence at line {first_line}"
        return ToolResult(
            content=f"edited {rel}: replaced {what}",
            summary=f"edited {rel} ({count} replacement{'s' if count > 1 else ''})",
            data={"path": rel, "replacements": count},
        )


class FsDeleteFiles(_WritesFiles, Tool):
    path_arguments = ("paths",)

    name = "fs_delete_files"
    description = (
        "Delete files from the workspace (not directories). All paths are checked first; if any is "
        "refused, nothing is deleted."
    )
    input_schema = {
        "type": "object",
        "properties": {
            "paths": {
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "minItems": 1,
                "maxItems": MAX_DELETE_PATHS,
                "uniqueItems": True,
                "description": "File paths relative to the workspace root.",
            }
        },
        "required": ["paths"],
        "additionalProperties": False,
    }
    risk = Risk.DESTRUCTIVE
    read_only = False
    idempotent = False

    def run(self, ctx: ToolContext, args: dict) -> ToolResult:
        targets: list[tuple[str, Path]] = []
        for user_path in args["paths"]:
            resolved = resolve_in_workspace(ctx.workspace, user_path, must_exist=True)
            # A symlink (already known to point inside) is deleted itself, never its target.
            trimmed = user_path.rstrip("/") or user_path
            parent = resolve_in_workspace(ctx.workspace, os.path.dirname(trimmed) or ".")
            entry = parent / os.path.basename(trimmed)
            victim = entry if entry.is_symlink() else resolved
            if not victim.is_symlink() and victim.is_dir():
                raise ToolError(
                    f"{user_path!r} is a directory; fs_delete_files deletes files only", code="is_a_directory"
                )
            targets.append((user_path, victim))

        deleted: list[str] = []
        for user_path, victim in targets:
            rel = relative_posix(ctx.workspace, victim.parent) + "/" + victim.name
            rel = rel.removeprefix("./")
            try:
                victim.unlink()
            except FileNotFoundError:
                continue  # gone since the check (or listed twice through a link): already the goal
            except OSError as exc:
                done = f" (already deleted: {', '.join(deleted)})" if deleted else ""
                raise ToolError(
                    f"could not delete {user_path!r}: {exc.strerror or exc}{done}", code="os_error"
                ) from exc
            ctx.port.file_changed(rel, "deleted")
            deleted.append(rel)
        listing = "\n".join(deleted) if deleted else "(nothing deleted)"
        return ToolResult(
            content=f"deleted {len(deleted)} file{'s' if len(deleted) != 1 else ''}:\n{listing}",
            summary=f"deleted {len(deleted)} file{'s' if len(deleted) != 1 else ''}",
            data={"deleted": deleted},
        )
