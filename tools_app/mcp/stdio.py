"""How an operator's stdio MCP server is sandboxed: its own directory, the host paths it may
read, its network and its limits (ARCHITECTURE §7; the sandbox itself is `sandbox.server`).

This module owns three facts:

- **Where a server's own directory is**: `XAGENT_MCP_SERVERS_DIR/<tenant id>/<server id>`,
  created on demand, bound read-write at /server (its working directory and HOME).
- **Which host paths a server may read** (`MCPServer.sandbox_read_paths`, operator-only):
  `check_read_paths` refuses `/`, relative or non-normalized paths, the kernel's and the
  sandbox's own mount points (/proc, /sys, /dev, /tmp, /server), and any path that is, holds
  or lies inside something of the product's (the workspaces root, the MCP servers root, the
  `var/` directory with the SQLite database, the database file, `.env`). A bound path shows the
  server only what a sandbox uid could read on the host anyway; the refusals cover what such a uid
  *can* read (a running command's workspace is its uid's, a SQLite file is world-readable). Checked at save and
  again at every start (settings or symlinks may have changed since).
- **How to run a Python module of this project as a sandboxed server**
  (`python_module_launch`, e.g. the shipped example server): the worker's interpreter may sit
  where the sandbox uids cannot reach (a pyenv build under /root), so the launch uses a system
  interpreter of the same minor version with the worker's site-packages and the module's
  package directory bound read-only and named in PYTHONPATH. Never the project directory
  itself: it holds `var/` (the database, every tenant's workspace). A root worker whose
  checkout or venv lies in a private directory (out of the sandbox uid's reach) binds read-only
  copies of them instead (`reachable_copy`, under `XAGENT_SANDBOX_DATA_DIR/python`).

The network comes from `MCPServer.network_enabled` (operator-only) and nothing else; limits
come from the tenant's default SandboxPolicy, as for `shell_exec` (its CPU, memory, process and
file-size limits and its fallback; not its `network`, which a tenant admin may edit, nor its
`filesystem` mode and wall-clock limit, which are about a Session workspace and one command).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import site
import stat
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from config import sandbox_reach
from tools_app.sandbox.server import SERVER_WORKDIR, ServerSandbox

logger = logging.getLogger(__name__)

# Kernel file systems, and the sandbox's own mount points: never bound over.
RESERVED_PATHS = ("/proc", "/sys", "/dev", "/tmp", "/etc", SERVER_WORKDIR)
# Of these, a path strictly below may be bound: read paths are bound after the sandbox's own
# tmpfs, so /tmp/checkout/pkg shows that directory and nothing else of the host's /tmp.
BELOW_ALLOWED = ("/tmp",)
ROOT_DIR_MODE = 0o711  # searchable by the sandbox uid, not listable
COPY_DIR_MODE = 0o755  # a package copy's directories: Python lists what it imports from


def protected_paths() -> list[Path]:
    """What of the product a server must never see: each path, its contents and its parents."""
    paths = [
        Path(settings.XAGENT_WORKSPACES_DIR),
        Path(settings.XAGENT_MCP_SERVERS_DIR),
        Path(settings.BASE_DIR) / "var",
        Path(settings.BASE_DIR) / ".env",
    ]
    database = settings.DATABASES["default"]
    if database.get("ENGINE", "").endswith("sqlite3") and str(database.get("NAME", "")).startswith("/"):
        paths.append(Path(database["NAME"]))
    return [Path(os.path.realpath(p)) for p in paths]


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def check_read_paths(paths) -> list[str]:
    """Validate an operator's read-only paths; return them as a list. Raises ValueError with a
    sentence naming the path and the rule."""
    if paths in (None, ""):
        return []
    if not isinstance(paths, list | tuple) or not all(isinstance(p, str) for p in paths):
        raise ValueError("Read-only paths must be a list of absolute paths (strings).")
    protected = protected_paths()
    for path in paths:
        if not path.startswith("/") or os.path.normpath(path) != path or "\x00" in path:
            raise ValueError(f"Read-only path {path!r} must be an absolute, normalized path.")
        if path == "/":
            raise ValueError("Read-only path '/' would show the server the whole host.")
        real = Path(os.path.realpath(path))
        if real != Path(path):
            raise ValueError(f"Read-only path {path} must not go through a symbolic link (use {real}).")
        for reserved in RESERVED_PATHS:
            if reserved in BELOW_ALLOWED and Path(reserved) in real.parents:
                continue
            if _overlaps(real, Path(reserved)):
                raise ValueError(
                    f"Read-only path {path} overlaps {reserved}, which the sandbox provides itself."
                )
        for guarded in protected:
            if _overlaps(real, guarded):
                raise ValueError(
                    f"Read-only path {path} would show the server product data ({guarded}: the "
                    "database, workspaces or server directories); bind a narrower path."
                )
        if not real.exists():
            raise ValueError(f"Read-only path {path} does not exist on this host.")
    return list(paths)


def server_directory(server) -> Path:
    """The server's own directory, created on demand (the sandbox layer sets its owner and mode)."""
    root = Path(settings.XAGENT_MCP_SERVERS_DIR)
    tenant_dir = root / str(server.tenant_id)
    for directory in (root, tenant_dir):
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(ROOT_DIR_MODE)
    path = tenant_dir / str(server.pk)
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def remove_server_directory(tenant_id: int, server_id: int) -> None:
    """A deleted server's directory goes with it: what the server kept there (caches, its own
    credentials) must not outlive it, nor be handed to a later server given the same id (SQLite
    may reuse ids). shutil.rmtree never follows the links a server may have planted there."""
    path = Path(settings.XAGENT_MCP_SERVERS_DIR) / str(tenant_id) / str(server_id)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)


def sandbox_for(server) -> ServerSandbox:
    """The sandbox an operator's stdio server runs in. Raises ValueError (a bad read path)."""
    from tools_app.catalog import sandbox_limits_for

    return ServerSandbox(
        directory=str(server_directory(server)),
        limits=sandbox_limits_for(server.tenant_id),
        network=bool(server.network_enabled),
        read_paths=tuple(check_read_paths(list(server.sandbox_read_paths or []))),
    )


@dataclass(frozen=True)
class PythonLaunch:
    """The command, arguments, environment and read-only paths that run a Python module of
    this project as a sandboxed stdio server (what `mcp_server add --python-module` records)."""

    command: str
    args: list[str]
    env: dict[str, str]
    read_paths: list[str]


def sandbox_python() -> str:
    """A Python the sandbox uid can run that can load this interpreter's site-packages: this
    interpreter itself if it lies under /usr, else /usr/bin/python3.X of the same minor version."""
    real = os.path.realpath(sys.executable)
    if real.startswith("/usr/"):
        return real
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidate = shutil.which(f"python{version}", path="/usr/local/bin:/usr/bin")
    if candidate is None:
        raise ValueError(
            f"No system Python {version} (/usr/bin/python{version}) for the sandbox: install it "
            "(apt-get install python3), or give the server a command the sandbox can run."
        )
    return candidate


def python_module_launch(module: str, args: list[str] | None = None) -> PythonLaunch:
    """How to run `python -m module` of this project inside a server's sandbox (module docstring)."""
    package = module.split(".", 1)[0]
    package_dir = Path(settings.BASE_DIR) / package
    if not module.replace(".", "").replace("_", "").isalnum() or not package_dir.is_dir():
        raise ValueError(f"{module!r} is not a module of this project's packages.")
    site_dirs = []
    for path in [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]:
        real = os.path.realpath(path)
        if os.path.isdir(real) and real not in site_dirs:
            site_dirs.append(real)
    try:
        site_dirs = [reachable_copy(path, project_code=False) for path in site_dirs]
        package_real = reachable_copy(os.path.realpath(package_dir), project_code=True)
    except ImproperlyConfigured as exc:
        raise ValueError(str(exc)) from None
    return PythonLaunch(
        command=sandbox_python(),
        args=["-m", module, *(args or [])],
        env={
            "PYTHONPATH": os.pathsep.join([os.path.dirname(package_real), *site_dirs]),
            "PYTHONDONTWRITEBYTECODE": "1",  # the bound paths are read-only
        },
        read_paths=[package_real, *site_dirs],
    )


def reachable_copy(source: str, *, project_code: bool) -> str:
    """`source` itself when a sandbox of this process can reach it; else (root, with the checkout or
    the venv in a private directory: config/sandbox_reach.py) a read-only copy of it under
    `XAGENT_SANDBOX_DATA_DIR/python/<name>-<digest>/<name>`, made once per content.

    A copy is never changed: its name is a digest of the source's path and state, so a server
    recorded with it keeps running what it was added with, and a changed source gets a new copy
    (the old ones stay for the servers that name them). Project code is copied file by file and
    its state is every file's size and mtime; a venv's site-packages (thousands of files, most of
    them never changed) is hard-linked where it can be (falling back to a copy, which is also made
    for a file others may not read) and its state is its listing, which pip changes whenever it
    installs, upgrades or removes a distribution."""
    if not sandbox_reach.out_of_reach(os.path.join(source, "_")):
        return source
    name = os.path.basename(source)
    state = repr((source, _source_state(source, every_file=project_code)))
    copies = sandbox_reach.prepare_data_dir(Path(settings.XAGENT_SANDBOX_DATA_DIR)) / "python"
    final = copies / f"{name}-{hashlib.sha256(state.encode()).hexdigest()[:16]}"
    if not final.is_dir():
        work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=copies))
        try:
            shutil.copytree(
                source,
                work / name,
                symlinks=True,
                ignore=shutil.ignore_patterns("__pycache__") if project_code else None,
                copy_function=partial(_link_or_copy, link=not project_code),
            )
            for directory, _, _ in os.walk(work):
                os.chmod(directory, COPY_DIR_MODE)
            try:
                os.rename(work, final)  # whole or not at all; another process may have won
            except OSError:
                if not final.is_dir():
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
        logger.info("copied %s to %s for sandboxed servers: the sandbox user cannot reach it", source, final)
    return str(final / name)


def _source_state(source: str, *, every_file: bool) -> list:
    if not every_file:
        return sorted(
            (entry.name, entry.stat(follow_symlinks=False).st_mtime_ns) for entry in os.scandir(source)
        )
    state = []
    for directory, subdirectories, files in os.walk(source):
        subdirectories[:] = sorted(d for d in subdirectories if d != "__pycache__")
        for file in sorted(files):
            st = os.lstat(os.path.join(directory, file))
            state.append((os.path.relpath(os.path.join(directory, file), source), st.st_size, st.st_mtime_ns))
    return state


def _link_or_copy(src: str, dst: str, *, link: bool) -> str:
    mode = os.stat(src).st_mode
    if link and mode & stat.S_IROTH:
        try:
            os.link(src, dst)
            return dst
        except OSError:
            pass  # another file system, or links refused: copy
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o755 if mode & stat.S_IXUSR else 0o644)
    return dst
