"""What the sandbox can reach, and where a private checkout keeps what it must (issue #31).

A root worker runs every sandbox as an unprivileged uid, and bwrap resolves what it binds (a
Session workspace, a stdio MCP server's directory, a read-only path) as that uid: every directory
above it must be searchable by others (o+x). A checkout in a private directory (a `mktemp -d`
folder, /root/…, mode 0700) is not, and its owner's directory modes are not ours to change.

This module owns one fact: the **sandbox data directory** of a checkout, the directory of the host
a root process uses instead of the checkout's `var/`: `XAGENT_SANDBOX_DATA_DIR` if set, else
/var/lib/xagent/<checkout name>-<hash of its path> (under the system temp directory where
/var/lib cannot be written). It is created root-owned and 0711 (searchable, not listable), and holds

- `workspaces/` and `mcp-servers/`: the default roots of Session workspaces and of stdio MCP
  servers' directories, when a root process finds the defaults under the checkout out of the
  sandbox's reach (config/settings.py). A root set in the environment is kept as given: the
  sandbox refuses one it cannot reach, saying why;
- `python/`: read-only copies of the Python packages a sandboxed server imports, when the
  checkout or the venv is out of reach (`tools_app.mcp.stdio.python_module_launch`).

Imported by config/settings.py: nothing here reads Django settings.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

VARIABLE = "XAGENT_SANDBOX_DATA_DIR"
DATA_DIR_MODE = 0o711
SUBDIRECTORIES = ("workspaces", "mcp-servers", "python")
SYSTEM_PARENT = Path("/var/lib/xagent")


def unsearchable_parent(path: Path | str) -> Path | None:
    """The first directory above `path`, from `/` down, that others may not search (no o+x in its
    mode), or None. Directories that do not exist yet are not judged (nor is anything below them).
    Mode bits only: the sandbox uids own nothing, so the "others" bit is the one that applies."""
    for parent in reversed(Path(os.path.abspath(path)).parents):
        try:
            st = os.stat(parent)
        except FileNotFoundError:
            return None
        except OSError:
            return parent
        if not st.st_mode & stat.S_IXOTH:
            return parent
    return None


def out_of_reach(path: Path | str) -> bool:
    """Whether a sandbox started by this process could not reach `path` (only root drops to
    another uid; any other user's sandbox runs as that user)."""
    return os.geteuid() == 0 and unsearchable_parent(path) is not None


def _default_parents() -> tuple[Path, Path]:
    return SYSTEM_PARENT, Path(tempfile.gettempdir()) / "xagent"


def default_data_dir(base_dir: Path) -> Path:
    """/var/lib/xagent/<name>-<hash>: stable for one checkout, distinct for two."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", base_dir.name)[:40] or "xagent"
    digest = hashlib.sha256(str(base_dir).encode()).hexdigest()[:12]
    system, temporary = _default_parents()
    return (system if os.access(system.parent, os.W_OK) else temporary) / f"{name}-{digest}"


def prepare_data_dir(path: Path) -> Path:
    """Create `path` and its subdirectories (module docstring) 0711, owned by this process's
    user, and check that others may search it and everything above; in a default's parent (which
    may lie in the shared temp directory) the same for that parent. An existing directory is used
    as it is, never re-moded: one of another owner, or one out of reach, stops the process with a
    sentence naming the variable."""
    if not path.is_absolute():
        raise ImproperlyConfigured(f"{VARIABLE}: {path} is not an absolute path")
    for directory in (path.parent, path) if path.parent in _default_parents() else (path,):
        try:
            directory.mkdir(mode=DATA_DIR_MODE)
            os.chmod(directory, DATA_DIR_MODE)  # mkdir's mode passes through the umask
        except FileExistsError:
            pass
        except OSError as exc:
            raise ImproperlyConfigured(f"{VARIABLE}: cannot create {directory}: {exc.strerror}") from exc
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise ImproperlyConfigured(
                f"{VARIABLE}: {directory} is not a directory owned by this user (uid {os.geteuid()})"
            )
    if blocked := unsearchable_parent(path / "_"):
        raise ImproperlyConfigured(
            f"{VARIABLE}: the sandbox user cannot search {blocked}, so it cannot reach {path}; "
            "choose a directory whose parents others may search"
        )
    for name in SUBDIRECTORIES:
        try:
            (path / name).mkdir(mode=DATA_DIR_MODE)
            os.chmod(path / name, DATA_DIR_MODE)
        except FileExistsError:
            pass
    return path
