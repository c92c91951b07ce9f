"""Building blocks for Skill tests: the fixture folders, hand-made zips, SKILL.md variants."""

from __future__ import annotations

import io
import stat
import zipfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "skills"
FIXTURE_NAMES = ["csv-cleanup", "pdf-report", "research-guide"]


def skill_md(name="demo-skill", description="Does a demo thing.", extra="", body="# Demo\n\nDo it.\n") -> str:
    return f"---\nname: {name}\ndescription: {description}\n{extra}---\n\n{body}"


def make_zip(
    entries: dict[str, bytes | str],
    *,
    modes: dict[str, int] | None = None,
    method: int = zipfile.ZIP_DEFLATED,
) -> bytes:
    """A zip of `entries` (path -> content); `modes` sets an entry's unix mode (e.g. S_IFLNK)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in entries.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = method
            mode = (modes or {}).get(name)
            if mode is not None:
                info.create_system = 3
                info.external_attr = mode << 16
            archive.writestr(info, content)
    return buffer.getvalue()


def symlink_zip(name="demo-skill") -> bytes:
    return make_zip(
        {f"{name}/SKILL.md": skill_md(name), f"{name}/link": "/etc/passwd"},
        modes={f"{name}/link": stat.S_IFLNK | 0o777},
    )


def folder_files(root: Path) -> dict[str, tuple[bytes, bool]]:
    """Every file under `root`: relative path -> (bytes, executable)."""
    return {
        path.relative_to(root).as_posix(): (path.read_bytes(), bool(path.stat().st_mode & 0o111))
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }
