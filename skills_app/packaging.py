"""Skill packages in and out: the one owner of writing Skills.

A *package* is what an Agent Skill is on disk (https://agentskills.io/specification): a SKILL.md
(YAML frontmatter + markdown) and resource files. This module

- reads a package from a folder, a zip or a pasted SKILL.md (`read_folder`, `read_zip`,
  `read_skill_md`), refusing anything that could escape or blow up: `..`, absolute paths,
  drive letters, backslashes, symlinks (never followed), non-regular files, more than
  `XAGENT_SKILL_MAX_FILES` files or `XAGENT_SKILL_MAX_BYTES` decompressed bytes (counted while
  reading, not taken from zip headers), corrupt archives;
- parses and validates SKILL.md (`parse_skill_md`) per the spec; errors are field-named
  (`SkillPackageError.errors`: {"name": [...], "archive": [...], ...});
- writes Skills (`import_package`, `import_skill_md`, `set_enabled`, `delete_skills`): a
  `SkillVersion` keeps the package byte for byte and never changes; the Skill's projection
  fields (name, description, body, ...) are parsed from its current version here and nowhere
  else;
- exports a version back (`export_to_folder`, `export_zip`, `export_zip_many`), so that
  export -> import -> export is byte-identical.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import struct
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import yaml
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max

from tenancy_app import audit

from .models import (
    MAX_ALLOWED_TOOLS_LENGTH,
    MAX_COMPATIBILITY_LENGTH,
    MAX_DESCRIPTION_LENGTH,
    MAX_LICENSE_LENGTH,
    MAX_NAME_LENGTH,
    SKILL_NAME_PATTERN,
    Skill,
    SkillFile,
    SkillVersion,
)

SKILL_MD = "SKILL.md"
ALLOWED_KEYS = ("name", "description", "license", "compatibility", "metadata", "allowed-tools")
MAX_PATH_LENGTH = 255  # SkillFile.path
IGNORED_NAMES = {".DS_Store"}
IGNORED_TOP_DIRS = {"__MACOSX"}
# Exported zips carry this date on every entry, so the same version always gives the same bytes.
ZIP_DATE_TIME = (1980, 1, 1, 0, 0, 0)
READABLE_COMPRESSION = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
# YAML parsing costs far more than its size suggests (QA: 3 MB of keys held a worker 12 s).
MAX_FRONTMATTER_BYTES = 64 * 1024
_CHUNK = 64 * 1024
# What zipfile and zlib raise on a damaged or exotic archive (unknown compression, encryption).
_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    struct.error,
    NotImplementedError,
    RuntimeError,
    OSError,
    EOFError,
    ValueError,
    KeyError,
)


class SkillPackageError(Exception):
    """A package that cannot be imported. `errors` maps a field ("name", "description",
    "frontmatter", "skill_md", "archive", "files", ...) to readable messages."""

    def __init__(self, errors: dict[str, list[str]]):
        self.errors = {key: list(messages) for key, messages in errors.items() if messages}
        super().__init__(str(self))

    @classmethod
    def one(cls, key: str, message: str) -> SkillPackageError:
        return cls({key: [message]})

    def messages(self) -> list[str]:
        """Each error as "field: message"."""
        return [f"{key}: {message}" for key, messages in self.errors.items() for message in messages]

    def __str__(self) -> str:
        return "; ".join(self.messages())


# --- the package value ------------------------------------------------------------------------


@dataclass(frozen=True)
class PackageFile:
    path: str  # relative POSIX path inside the skill folder
    content: bytes
    executable: bool = False


@dataclass(frozen=True)
class SkillPackage:
    """SKILL.md and the resource files, as read; `folder` is the skill folder's name (a folder
    import, or a zip's single top-level folder), which must equal the skill's name."""

    skill_md: bytes
    files: tuple[PackageFile, ...] = ()
    folder: str | None = None

    def sha256(self) -> str:
        """Digest of the whole package: SKILL.md then each file by path, each framed with its
        path, executable bit and length, so no two packages share a digest by concatenation."""
        digest = hashlib.sha256()
        for path, content, executable in [
            (SKILL_MD, self.skill_md, False),
            *((f.path, f.content, f.executable) for f in sorted(self.files, key=lambda f: f.path)),
        ]:
            encoded = path.encode()
            digest.update(len(encoded).to_bytes(4, "big") + encoded)
            digest.update(b"x" if executable else b"-")
            digest.update(len(content).to_bytes(8, "big"))
            digest.update(content)
        return digest.hexdigest()


@dataclass(frozen=True)
class ParsedSkill:
    name: str
    description: str
    body: str
    license: str = ""
    compatibility: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    allowed_tools: str = ""


@dataclass(frozen=True)
class ImportResult:
    skill: Skill
    version: SkillVersion
    status: str  # "created" (a new Skill), "updated" (a new version), "unchanged"

    @property
    def created(self) -> bool:
        return self.status == "created"

    @property
    def changed(self) -> bool:
        return self.status != "unchanged"


# --- limits -----------------------------------------------------------------------------------


def max_files() -> int:
    return settings.XAGENT_SKILL_MAX_FILES


def max_bytes() -> int:
    return settings.XAGENT_SKILL_MAX_BYTES


def _too_many_files() -> SkillPackageError:
    return SkillPackageError.one(
        "files",
        f"the skill has more than {max_files()} files (XAGENT_SKILL_MAX_FILES, SKILL.md included)",
    )


def _too_large() -> SkillPackageError:
    return SkillPackageError.one(
        "files",
        f"the skill is larger than {max_bytes()} bytes uncompressed (XAGENT_SKILL_MAX_BYTES)",
    )


class _Budget:
    """Counts the bytes really read across a whole package."""

    def __init__(self):
        self.left = max_bytes()

    def read(self, stream) -> bytes:
        chunks = []
        while True:
            chunk = stream.read(min(_CHUNK, self.left + 1))
            if not chunk:
                return b"".join(chunks)
            self.left -= len(chunk)
            if self.left < 0:
                raise _too_large()
            chunks.append(chunk)


# --- SKILL.md ---------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice (YAML says keys are unique; PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:
                duplicate = False
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice", key_node.start_mark
                )
            try:
                seen.add(key)
            except TypeError:
                pass
        return super().construct_mapping(node, deep=deep)


def _clipped(text: str, limit: int = 300) -> str:
    """Error messages quote what they refuse, but never all of a huge value."""
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def split_frontmatter(text: str) -> tuple[str, str]:
    """(frontmatter YAML, body): the file starts with a `---` line and the frontmatter ends at
    the next line that is exactly `---`."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].rstrip("\r\n") != "---":
        raise SkillPackageError.one("frontmatter", "SKILL.md must start with a line `---` (YAML frontmatter)")
    for index, line in enumerate(lines[1:], start=1):
        if line.rstrip("\r\n") == "---":
            return "".join(lines[1:index]), "".join(lines[index + 1 :])
    raise SkillPackageError.one("frontmatter", "the frontmatter is not closed by a line `---`")


def parse_skill_md(data: bytes, *, folder: str | None = None) -> ParsedSkill:
    """Parse and validate SKILL.md; `folder` (when the skill came in a folder) must equal the name."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SkillPackageError.one("skill_md", f"SKILL.md is not UTF-8 (byte {exc.start})") from None
    if "\x00" in text:
        # Text columns (PostgreSQL) cannot hold it, and no SKILL.md needs it.
        raise SkillPackageError.one("skill_md", f"SKILL.md holds a NUL character (at {text.index(chr(0))})")
    if text.startswith("\ufeff"):
        raise SkillPackageError.one(
            "frontmatter",
            "SKILL.md starts with a byte-order mark; save it as UTF-8 without BOM so `---` comes first",
        )
    frontmatter, body = split_frontmatter(text)
    if len(frontmatter.encode()) > MAX_FRONTMATTER_BYTES:
        raise SkillPackageError.one(
            "frontmatter",
            f"the frontmatter is {len(frontmatter.encode())} bytes; at most {MAX_FRONTMATTER_BYTES} "
            "(the instructions go in the body, after the closing `---`)",
        )
    try:
        values = yaml.load(frontmatter, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        # PyYAML parses nesting recursively: ~500 levels of `[` exhaust Python's stack.
        raise SkillPackageError.one("frontmatter", "the frontmatter is nested too deeply") from None
    except yaml.YAMLError as exc:
        reason = _clipped(" ".join(str(exc).split()))
        raise SkillPackageError.one("frontmatter", f"the frontmatter is not valid YAML: {reason}") from None
    if not isinstance(values, dict):
        raise SkillPackageError.one(
            "frontmatter", "the frontmatter must be a YAML mapping (key: value lines)"
        )

    errors: dict[str, list[str]] = {}

    def refuse(key: str, message: str) -> None:
        errors.setdefault(key, []).append(message)

    for key, value in values.items():
        # A YAML escape ("\0") makes a NUL the raw text did not show: text columns refuse it.
        texts = (
            [value]
            if isinstance(value, str)
            else [*value.keys(), *value.values()]
            if isinstance(value, dict)
            else []
        )
        if any(isinstance(text, str) and "\x00" in text for text in texts):
            refuse(str(key) if key in ALLOWED_KEYS else "frontmatter", "holds a NUL character")
    unknown = sorted(_clipped(str(key), 60) for key in values if key not in ALLOWED_KEYS)
    if unknown:
        shown = ", ".join(unknown[:10]) + (f" and {len(unknown) - 10} more" if len(unknown) > 10 else "")
        refuse(
            "frontmatter",
            f"unknown field(s) {shown}; the Agent Skills spec allows only {', '.join(ALLOWED_KEYS)}"
            " (put anything else under metadata)",
        )

    name = values.get("name")
    if name is None:
        refuse("name", "this field is required")
    elif not isinstance(name, str):
        refuse("name", f"must be a string (YAML read {_clipped(repr(name), 60)}; quote it)")
    elif not name:
        refuse("name", "must not be empty")
    else:
        if len(name) > MAX_NAME_LENGTH:
            refuse("name", f"at most {MAX_NAME_LENGTH} characters ({len(name)} given)")
        if not re.fullmatch(SKILL_NAME_PATTERN, name):
            refuse(
                "name",
                f"{name!r}: use lowercase letters a-z, digits and single hyphens, "
                "not at the start or end (e.g. pdf-reports)",
            )
        if folder is not None and folder != name:
            refuse("name", f"must equal the skill's folder name ({folder!r}); it is {name!r}")

    description = values.get("description")
    if description is None:
        refuse("description", "this field is required")
    elif not isinstance(description, str):
        refuse("description", f"must be a string (YAML read {_clipped(repr(description), 60)}; quote it)")
    elif not description.strip():
        refuse("description", "must not be empty")
    elif len(description) > MAX_DESCRIPTION_LENGTH:
        refuse("description", f"at most {MAX_DESCRIPTION_LENGTH} characters ({len(description)} given)")

    # An optional field left empty (`license:`) counts as absent.
    for key, limit in (("license", MAX_LICENSE_LENGTH), ("allowed-tools", MAX_ALLOWED_TOOLS_LENGTH)):
        if values.get(key) is not None and not isinstance(values[key], str):
            refuse(key, "must be a string")
        elif len(values.get(key) or "") > limit:
            refuse(key, f"at most {limit} characters ({len(values[key])} given)")
    compatibility = values.get("compatibility")
    if compatibility is not None:
        if not isinstance(compatibility, str):
            refuse("compatibility", "must be a string")
        elif len(compatibility) > MAX_COMPATIBILITY_LENGTH:
            refuse(
                "compatibility",
                f"at most {MAX_COMPATIBILITY_LENGTH} characters ({len(compatibility)} given)",
            )

    metadata = values.get("metadata")
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict):
        refuse("metadata", "must be a mapping of names to strings")
        metadata = {}
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            refuse("metadata", f'{key!r}: keys and values must be strings (quote values such as "1.0")')

    if errors:
        raise SkillPackageError(errors)
    return ParsedSkill(
        name=name,
        description=description.strip(),
        body=body.strip(),
        license=values.get("license") or "",
        compatibility=compatibility or "",
        metadata=dict(metadata),
        allowed_tools=values.get("allowed-tools") or "",
    )


def validate_package(package: SkillPackage) -> ParsedSkill:
    """Everything an import checks before it writes: the limits, the paths, SKILL.md."""
    if len(package.files) + 1 > max_files():
        raise _too_many_files()
    total = len(package.skill_md) + sum(len(f.content) for f in package.files)
    if total > max_bytes():
        raise _too_large()
    paths = [f.path for f in package.files]
    if len(set(paths)) != len(paths):
        raise SkillPackageError.one("files", "a file path appears twice")
    for path in paths:
        _check_path(path, "files")
        if path == SKILL_MD:
            raise SkillPackageError.one("files", "SKILL.md is given twice")
    return parse_skill_md(package.skill_md, folder=package.folder)


# --- readers ----------------------------------------------------------------------------------


def _check_path(name: str, key: str) -> PurePosixPath:
    """A relative POSIX path that stays inside the skill folder, or a refusal naming it."""
    shown = name if len(name) <= 200 else name[:200] + "…"
    if "\\" in name:
        raise SkillPackageError.one(key, f"entry {shown} uses a backslash; paths use /")
    if "\x00" in name:
        raise SkillPackageError.one(key, f"entry {shown!r} holds a NUL character")
    if name.startswith("/") or (len(name) >= 2 and name[1] == ":" and name[0].isalpha()):
        raise SkillPackageError.one(key, f"entry {shown} is an absolute path")
    parts = name.rstrip("/").split("/")
    if ".." in parts:
        raise SkillPackageError.one(key, f"entry {shown} escapes the skill folder")
    if any(part in ("", ".") for part in parts):
        raise SkillPackageError.one(key, f"entry {shown} has an empty or '.' path segment")
    if len(name) > MAX_PATH_LENGTH:
        raise SkillPackageError.one(key, f"entry {shown} is longer than {MAX_PATH_LENGTH} characters")
    return PurePosixPath(name)


def _ignored(parts: Iterable[str]) -> bool:
    parts = list(parts)
    return bool(parts) and (parts[0] in IGNORED_TOP_DIRS or parts[-1] in IGNORED_NAMES)


def read_skill_md(text: str) -> SkillPackage:
    """A package from a pasted SKILL.md (no resources). Browsers send CRLF line ends from a text
    area; a pasted text has no bytes to keep, so they become LF."""
    data = text.replace("\r\n", "\n").encode("utf-8")
    if len(data) > max_bytes():
        raise _too_large()
    return SkillPackage(skill_md=data)


def read_folder(path: str | os.PathLike) -> SkillPackage:
    """A package from a skill folder. Symlinks are refused, never followed."""
    root = os.path.normpath(os.path.abspath(path))
    try:
        root_stat = os.stat(root)
    except OSError as exc:
        raise SkillPackageError.one("files", f"cannot read {path}: {exc.strerror}") from None
    if not stat.S_ISDIR(root_stat.st_mode):
        raise SkillPackageError.one("files", f"{path} is not a folder")
    budget = _Budget()
    found: dict[str, tuple[bytes, bool]] = {}

    def walk(directory: str, prefix: str) -> None:
        with os.scandir(directory) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel = f"{prefix}{entry.name}"
                if entry.name in IGNORED_NAMES or (not prefix and entry.name in IGNORED_TOP_DIRS):
                    continue
                if entry.is_symlink():
                    raise SkillPackageError.one("files", f"{rel} is a symbolic link; symlinks are refused")
                if entry.is_dir(follow_symlinks=False):
                    walk(entry.path, f"{rel}/")
                elif entry.is_file(follow_symlinks=False):
                    _check_path(rel, "files")
                    if len(found) + 1 > max_files():
                        raise _too_many_files()
                    found[rel] = _read_regular_file(entry.path, rel, budget)
                else:
                    raise SkillPackageError.one("files", f"{rel} is not a regular file")

    walk(root, "")
    return _assemble(found, folder=os.path.basename(root), key="files")


def _read_regular_file(path: str, rel: str, budget: _Budget) -> tuple[bytes, bool]:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise SkillPackageError.one("files", f"cannot read {rel}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise SkillPackageError.one("files", f"{rel} is not a regular file")
        return budget.read(handle), bool(mode & 0o111)


def read_zip(source: bytes | io.IOBase) -> SkillPackage:
    """A package from a zip: the skill's files at the root, or under one top-level folder (whose
    name must then be the skill's name). `__MACOSX/` and `.DS_Store` are skipped."""
    stream = io.BytesIO(source) if isinstance(source, (bytes, bytearray)) else source
    try:
        archive = zipfile.ZipFile(stream)
    except _ZIP_ERRORS as exc:
        raise SkillPackageError.one("archive", f"not a readable zip file ({exc})") from None
    with archive:
        entries = []
        for info in archive.infolist():
            name = info.filename
            _check_path(name, "archive")
            parts = name.rstrip("/").split("/")
            if _ignored(parts):
                continue
            mode = info.external_attr >> 16
            kind = stat.S_IFMT(mode)
            if kind == stat.S_IFLNK:
                raise SkillPackageError.one(
                    "archive", f"entry {name} is a symbolic link; symlinks are refused"
                )
            if info.is_dir() or kind == stat.S_IFDIR:
                continue
            if kind not in (0, stat.S_IFREG):
                raise SkillPackageError.one("archive", f"entry {name} is not a regular file")
            if info.compress_type not in READABLE_COMPRESSION:
                # zipfile bounds what one read decompresses only for deflate: a bzip2 or LZMA
                # entry of a few hundred bytes could expand to gigabytes before the budget sees it.
                raise SkillPackageError.one(
                    "archive",
                    f"entry {name} uses compression method {info.compress_type}; "
                    "use a zip with stored or deflated entries (the usual kind)",
                )
            entries.append((info, parts, bool(mode & 0o111)))
        if len(entries) > max_files():
            raise _too_many_files()
        # Header sizes are only a first filter (they can lie): the budget counts real bytes.
        if sum(info.file_size for info, _, _ in entries) > max_bytes():
            raise _too_large()

        folder = None
        if not any(parts == [SKILL_MD] for _, parts, _ in entries):
            tops = {parts[0] for _, parts, _ in entries if len(parts) > 1}
            loose = [parts[0] for _, parts, _ in entries if len(parts) == 1]
            if len(tops) == 1 and not loose:
                folder = tops.pop()
            elif len(tops) > 1:
                raise SkillPackageError.one(
                    "archive",
                    "put the skill's files at the root of the zip or in one top-level folder "
                    f"(found {', '.join(sorted(tops)[:5])})",
                )
        budget = _Budget()
        found: dict[str, tuple[bytes, bool]] = {}
        for info, parts, executable in entries:
            rel = "/".join(parts[1:] if folder else parts)
            if rel in found:
                raise SkillPackageError.one("archive", f"entry {info.filename} appears twice")
            try:
                with archive.open(info) as member:
                    found[rel] = (budget.read(member), executable)
            except _ZIP_ERRORS as exc:
                raise SkillPackageError.one(
                    "archive", f"entry {info.filename} cannot be read ({exc})"
                ) from None
    return _assemble(found, folder=folder, key="archive")


def _assemble(found: dict[str, tuple[bytes, bool]], *, folder: str | None, key: str) -> SkillPackage:
    if SKILL_MD not in found:
        where = f"in the folder {folder}" if folder else "at the root"
        raise SkillPackageError.one("skill_md", f"no SKILL.md {where} of the skill")
    skill_md, _ = found.pop(SKILL_MD)
    files = tuple(
        PackageFile(path, content, executable) for path, (content, executable) in sorted(found.items())
    )
    return SkillPackage(skill_md=skill_md, files=files, folder=folder)


def read_upload(upload) -> SkillPackage:
    """A package from an uploaded zip (a Django UploadedFile). A compressed archive over twice the
    uncompressed limit is refused before it is opened."""
    size = getattr(upload, "size", None)
    if size is not None and size > 2 * max_bytes():
        raise SkillPackageError.one(
            "archive",
            f"the zip is {size} bytes; at most {2 * max_bytes()} are accepted (2 × XAGENT_SKILL_MAX_BYTES)",
        )
    return read_zip(upload)


def read_path(path: str | os.PathLike) -> tuple[SkillPackage, str]:
    """A folder or a `.zip` file; returns (package, origin)."""
    if os.path.isdir(path):
        return read_folder(path), SkillVersion.Origin.FOLDER
    try:
        with open(path, "rb") as handle:
            return read_zip(handle), SkillVersion.Origin.ZIP
    except OSError as exc:
        raise SkillPackageError.one("archive", f"cannot read {path}: {exc.strerror}") from None


# --- writes -----------------------------------------------------------------------------------


def _locked(tenant, name: str) -> Skill | None:
    skills = Skill.objects.select_for_update().filter(name=name)
    skills = skills.filter(tenant__isnull=True) if tenant is None else skills.filter(tenant=tenant)
    return skills.first()


def check_package(
    package: SkillPackage, *, tenant=None, skill: Skill | None = None, new: bool = False
) -> ParsedSkill:
    """What `import_package` would refuse, without writing (admin forms call it in `clean`)."""
    parsed = validate_package(package)
    if skill is not None and parsed.name != skill.name:
        raise SkillPackageError.one(
            "name", f"a new version must keep the name {skill.name!r}; this SKILL.md says {parsed.name!r}"
        )
    if new and skill is None:
        existing = Skill.objects.filter(name=parsed.name)
        existing = existing.filter(tenant__isnull=True) if tenant is None else existing.filter(tenant=tenant)
        if existing.exists():
            raise SkillPackageError.one(
                "name",
                f"a Skill named {parsed.name!r} already exists here; open it to add a new version",
            )
    return parsed


def import_package(
    package: SkillPackage,
    *,
    tenant=None,
    by: str = "",
    origin: str = SkillVersion.Origin.FOLDER,
    skill: Skill | None = None,
) -> ImportResult:
    """Create the Skill (tenant None: global) or add a version to it, in one transaction.

    A package byte-identical to the current version adds nothing (`status` "unchanged").
    With `skill`, the package must carry that Skill's name and goes into its tenant.
    `enabled` is kept as it is.
    """
    if skill is not None:
        tenant = skill.tenant
    parsed = check_package(package, skill=skill)
    digest = package.sha256()
    with transaction.atomic(), audit.as_one_entry():
        current = _locked(tenant, parsed.name)
        status = "updated"
        if current is None:
            try:
                with transaction.atomic():
                    current = Skill.objects.create(
                        tenant=tenant, name=parsed.name, description=parsed.description
                    )
                status = "created"
            except IntegrityError:  # created meanwhile by a concurrent import
                current = _locked(tenant, parsed.name)
                if current is None:
                    raise
        elif current.current_version_id is not None:
            latest = current.current_version
            if latest.sha256 == digest:
                return ImportResult(current, latest, "unchanged")
        number = (current.versions.aggregate(top=Max("number"))["top"] or 0) + 1
        version = SkillVersion.objects.create(
            skill=current,
            number=number,
            skill_md=package.skill_md,
            sha256=digest,
            origin=origin,
            created_by=by[:150],
        )
        SkillFile.objects.bulk_create(
            SkillFile(
                version=version,
                path=f.path,
                content=f.content,
                size=len(f.content),
                sha256=hashlib.sha256(f.content).hexdigest(),
                executable=f.executable,
            )
            for f in package.files
        )
        current.description = parsed.description
        current.body = parsed.body
        current.license = parsed.license
        current.compatibility = parsed.compatibility
        current.metadata = parsed.metadata
        current.allowed_tools = parsed.allowed_tools
        current.current_version = version
        current.version = number
        current.save()
        audit.record(
            "skill.imported",
            tenant_id=current.tenant_id,
            obj=current,
            changes={"version": {"after": number}, "sha256": {"after": digest}, "origin": {"after": origin}},
        )
    return ImportResult(current, version, status)


def package_with_skill_md(skill: Skill, text: str) -> SkillPackage:
    """The package a pasted SKILL.md makes for `skill`: the text, and the current version's resources."""
    pasted = read_skill_md(text)
    files = tuple(
        PackageFile(path, content, executable) for path, content, executable in _resource_rows(skill)
    )
    return SkillPackage(skill_md=pasted.skill_md, files=files)


def import_skill_md(skill: Skill, text: str, *, by: str = "") -> ImportResult:
    """A new version of `skill` from a pasted SKILL.md, keeping the current version's resources."""
    package = package_with_skill_md(skill, text)
    return import_package(package, skill=skill, by=by, origin=SkillVersion.Origin.PASTE)


def set_enabled(skill: Skill, enabled: bool) -> bool:
    """Switch a Skill on or off (compared with the stored value); returns whether it changed."""
    with transaction.atomic():
        locked = Skill.objects.select_for_update().get(pk=skill.pk)
        changed = locked.enabled != enabled
        if changed:
            locked.enabled = enabled
            locked.save(update_fields=["enabled", "updated_at"])
    skill.enabled = enabled
    skill.updated_at = locked.updated_at
    return changed


def delete_skills(skills: Iterable[Skill]) -> int:
    """Delete Skills with their history (each delete bumps its tenant's configuration)."""
    count = 0
    for skill in skills:
        skill.delete()
        count += 1
    return count


# --- reads and export -------------------------------------------------------------------------


def _resource_rows(skill_or_version) -> list[tuple[str, bytes, bool]]:
    version_id = _version_id(skill_or_version)
    if version_id is None:
        return []
    return [
        (path, bytes(content), executable)
        for path, content, executable in SkillFile.objects.filter(version_id=version_id)
        .order_by("path")
        .values_list("path", "content", "executable")
    ]


def _version_id(skill_or_version) -> int | None:
    if isinstance(skill_or_version, SkillVersion):
        return skill_or_version.pk
    return skill_or_version.current_version_id


def list_resources(skill_or_version) -> list[SkillFile]:
    """The resource files of a Skill's current version (or of a version), by path, without their
    content loaded (`path`, `size`, `sha256`, `executable`)."""
    version_id = _version_id(skill_or_version)
    if version_id is None:
        return []
    return list(SkillFile.objects.filter(version_id=version_id).defer("content").order_by("path"))


def read_resource(skill_or_version, path: str) -> bytes | None:
    """One file's bytes, SKILL.md or a resource (None when the version has no such file)."""
    version_id = _version_id(skill_or_version)
    if version_id is None:
        return None
    if path == SKILL_MD:
        rows = SkillVersion.objects.filter(pk=version_id).values_list("skill_md", flat=True)
    else:
        rows = SkillFile.objects.filter(version_id=version_id, path=path).values_list("content", flat=True)
    content = rows.first()
    return None if content is None else bytes(content)


def package_of(skill_or_version) -> SkillPackage:
    """The package a version holds (a Skill: its current version), as it was imported."""
    version = skill_or_version
    if isinstance(skill_or_version, Skill):
        if skill_or_version.current_version_id is None:
            raise SkillPackageError.one("skill_md", f"{skill_or_version.name} has no version yet")
        version = SkillVersion.objects.get(pk=skill_or_version.current_version_id)
    files = tuple(PackageFile(p, c, x) for p, c, x in _resource_rows(version))
    return SkillPackage(skill_md=bytes(version.skill_md), files=files, folder=version.skill.name)


def export_to_folder(skill_or_version, out: str | os.PathLike) -> Path:
    """Write `<out>/<name>/` (SKILL.md and resources; executables 0755, others 0644). The skill
    folder must not exist yet."""
    package = package_of(skill_or_version)
    target = Path(out) / package.folder
    if target.exists():
        raise SkillPackageError.one("files", f"{target} already exists")
    target.mkdir(parents=True)
    for rel, content, executable in _entries(package):
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(content)
        dest.chmod(0o755 if executable else 0o644)
    _exported(skill_or_version, "folder")
    return target


def _entries(package: SkillPackage) -> list[tuple[str, bytes, bool]]:
    files = [(SKILL_MD, package.skill_md, False)] + [(f.path, f.content, f.executable) for f in package.files]
    return sorted(files, key=lambda item: item[0])


def _write_zip_entries(archive: zipfile.ZipFile, package: SkillPackage) -> None:
    for rel, content, executable in _entries(package):
        info = zipfile.ZipInfo(f"{package.folder}/{rel}", date_time=ZIP_DATE_TIME)
        info.create_system = 3  # unix: external_attr holds the mode
        info.external_attr = (stat.S_IFREG | (0o755 if executable else 0o644)) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        archive.writestr(info, content, compresslevel=9)


def export_zip(skill_or_version) -> bytes:
    """A deterministic zip of one skill: one top folder `<name>/`, entries sorted, fixed dates."""
    return export_zip_many([skill_or_version])


def export_zip_many(skills: Iterable) -> bytes:
    """One zip holding each skill's folder; two skills of the same name cannot share one."""
    skills = list(skills)
    packages = sorted((package_of(skill) for skill in skills), key=lambda p: p.folder)
    names = [p.folder for p in packages]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SkillPackageError.one(
            "name", f"several selected Skills are named {', '.join(duplicates)}; export them separately"
        )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for package in packages:
            _write_zip_entries(archive, package)
    for skill in skills:
        _exported(skill, "zip")
    return buffer.getvalue()


def _exported(skill_or_version, how: str) -> None:
    skill = skill_or_version if isinstance(skill_or_version, Skill) else skill_or_version.skill
    audit.record("skill.exported", tenant_id=skill.tenant_id, obj=skill, changes={"as": {"after": how}})
