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
  server only what uid 65534 could read on the host anyway; the refusals cover what that uid
  *can* read (workspaces are owned by it, a SQLite file is world-readable). Checked at save and
  again at every start (settings or symlinks may have changed since).
- **How to run a Python module of this project as a sandboxed server**
  (`python_module_launch`, e.g. the shipped example server): the worker's interpreter may sit
  where uid 65534 cannot reach (a pyenv build under /root), so the launch uses a system
  interpreter of the same minor version with the worker's site-packages and the module's
  package directory bound read-only and named in PYTHONPATH. Never the project directory
  itself: it holds `var/` (the database, every tenant's workspace).

The network comes from `MCPServer.network_enabled` (operator-only) and nothing else; limits
come from the tenant's default SandboxPolicy, as for `shell_exec` (its CPU, memory, process and
file-size limits and its fallback; not its `network`, which a tenant admin may edit, nor its
`filesystem` mode and wall-clock limit, which are about a Session workspace and one command).
"""

from __future__ import annotations

import os
import shutil
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from tools_app.sandbox.server import SERVER_WORKDIR, ServerSandbox

# Kernel file systems, and the sandbox's own mount points: never bound over.
RESERVED_PATHS = ("/proc", "/sys", "/dev", "/tmp", "/etc", SERVER_WORKDIR)
# Of these, a path strictly below may be bound: read paths are bound after the sandbox's own
# tmpfs, so /tmp/checkout/pkg shows that directory and nothing else of the host's /tmp.
BELOW_ALLOWED = ("/tmp",)
ROOT_DIR_MODE = 0o711  # searchable by the sandbox uid, not listable


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
    package_real = os.path.realpath(package_dir)
    return PythonLaunch(
        command=sandbox_python(),
        args=["-m", module, *(args or [])],
        env={
            "PYTHONPATH": os.pathsep.join([os.path.dirname(package_real), *site_dirs]),
            "PYTHONDONTWRITEBYTECODE": "1",  # the bound paths are read-only
        },
        read_paths=[package_real, *site_dirs],
    )
