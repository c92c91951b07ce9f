"""A root worker whose checkout or venv the sandbox cannot reach runs `--python-module` servers
from read-only copies (tools_app/mcp/stdio.py `reachable_copy`, config/sandbox_reach.py)."""

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from config import sandbox_reach
from tools_app.mcp.stdio import python_module_launch, reachable_copy

IS_ROOT = os.geteuid() == 0
root_only = pytest.mark.skipif(not IS_ROOT, reason="only a root process drops to the sandbox uids")


@pytest.fixture
def open_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="xagent-copies-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def data_dir(settings, open_dir) -> Path:
    settings.XAGENT_SANDBOX_DATA_DIR = open_dir / "data"
    return open_dir / "data"


@pytest.fixture
def private_checkout(open_dir) -> Path:
    """A checkout in a directory others may not search, holding one small package."""
    checkout = open_dir / "private" / "checkout"
    package = checkout / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__pycache__").mkdir()
    (package / "__init__.py").write_text("")
    (package / "server.py").write_text("print('serving')\n")
    (package / "sub" / "tool.sh").write_text("#!/bin/sh\n")
    (package / "sub" / "tool.sh").chmod(0o700)
    (package / "__pycache__" / "server.cpython-311.pyc").write_bytes(b"stale")
    (open_dir / "private").chmod(0o700)
    return checkout


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_what_the_sandbox_reaches_is_used_as_it_is(open_dir, data_dir):
    (open_dir / "pkg").mkdir()

    assert reachable_copy(str(open_dir / "pkg"), project_code=True) == str(open_dir / "pkg")
    assert not data_dir.exists()


@root_only
def test_project_code_out_of_reach_is_copied_once_per_content(private_checkout, data_dir):
    source = private_checkout / "pkg"

    copy = Path(reachable_copy(str(source), project_code=True))

    assert copy.name == "pkg" and copy.parent.parent == data_dir / "python"
    assert sandbox_reach.unsearchable_parent(copy / "server.py") is None
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*")) == [
        "__init__.py",
        "server.py",
        "sub",
        "sub/tool.sh",
    ]  # no bytecode of the host's
    assert (copy / "server.py").read_text() == "print('serving')\n"
    assert (mode(copy), mode(copy / "sub"), mode(copy / "server.py"), mode(copy / "sub" / "tool.sh")) == (
        0o755,
        0o755,
        0o644,
        0o755,
    )
    assert reachable_copy(str(source), project_code=True) == str(copy)  # unchanged: the same copy

    (source / "server.py").write_text("print('serving v2')\n")
    newer = Path(reachable_copy(str(source), project_code=True))

    assert newer != copy and (newer / "server.py").read_text() == "print('serving v2')\n"
    assert (copy / "server.py").read_text() == "print('serving')\n"  # a recorded server keeps its copy


@root_only
def test_site_packages_out_of_reach_are_hard_linked_and_unreadable_files_copied(private_checkout, data_dir):
    site = private_checkout / ".venv" / "lib" / "site-packages"
    (site / "dist").mkdir(parents=True)
    (site / "dist" / "__init__.py").write_text("x = 1\n")
    (site / "dist" / "__init__.py").chmod(0o644)
    (site / "dist" / "secret_mode.py").write_text("y = 2\n")
    (site / "dist" / "secret_mode.py").chmod(0o600)

    copy = Path(reachable_copy(str(site), project_code=False))

    linked, copied = copy / "dist" / "__init__.py", copy / "dist" / "secret_mode.py"
    assert os.stat(linked).st_ino == os.stat(site / "dist" / "__init__.py").st_ino
    assert os.stat(copied).st_ino != os.stat(site / "dist" / "secret_mode.py").st_ino
    assert (mode(copied), mode(site / "dist" / "secret_mode.py")) == (0o644, 0o600)  # the source is untouched
    assert mode(copy / "dist") == 0o755

    (site / "other-1.0.dist-info").mkdir()  # pip installed something
    assert reachable_copy(str(site), project_code=False) != str(copy)


@root_only
def test_a_python_module_launch_from_a_private_checkout_names_only_copies(
    settings, private_checkout, data_dir
):
    settings.BASE_DIR = private_checkout

    launch = python_module_launch("pkg.server")

    package_copy = launch.read_paths[0]
    assert Path(package_copy).name == "pkg" and Path(package_copy).is_relative_to(data_dir)
    assert launch.env["PYTHONPATH"].split(os.pathsep)[0] == str(Path(package_copy).parent)
    for path in [*launch.read_paths, *launch.env["PYTHONPATH"].split(os.pathsep)]:
        assert sandbox_reach.unsearchable_parent(Path(path) / "_") is None, path
