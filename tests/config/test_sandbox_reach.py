"""What the sandbox can reach, and the sandbox data directory a private checkout uses instead
(config/sandbox_reach.py, issue #31); the runstack banner that names it."""

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from config import sandbox_reach
from sessions_app.management.commands.runstack import sandbox_data_notes

IS_ROOT = os.geteuid() == 0
root_only = pytest.mark.skipif(not IS_ROOT, reason="only a root process drops to the sandbox uids")


@pytest.fixture
def open_dir() -> Path:
    """A directory whose every parent others may search (pytest's tmp_path is below a 0700 one)."""
    path = Path(tempfile.mkdtemp(prefix="xagent-reach-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def private_dir(open_dir) -> Path:
    """A directory others may not search, like `mktemp -d` or /root."""
    path = open_dir / "private"
    path.mkdir(mode=0o700)
    return path


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_it_names_the_first_directory_others_cannot_search(private_dir, open_dir):
    assert sandbox_reach.unsearchable_parent(private_dir / "checkout" / "var" / "workspaces") == private_dir
    assert sandbox_reach.unsearchable_parent(open_dir / "var" / "workspaces") is None
    # What does not exist yet is not judged; the path itself is not either (only what is above).
    assert sandbox_reach.unsearchable_parent(open_dir / "missing" / "deeper" / "var") is None
    (open_dir / "closed").mkdir(mode=0o700)
    assert sandbox_reach.unsearchable_parent(open_dir / "closed") is None
    assert sandbox_reach.unsearchable_parent(open_dir / "closed" / "var") == open_dir / "closed"


def test_only_a_root_process_is_out_of_reach(private_dir, open_dir):
    assert sandbox_reach.out_of_reach(private_dir / "checkout" / "var") is IS_ROOT
    assert sandbox_reach.out_of_reach(open_dir / "var") is False


def test_the_default_data_dir_is_stable_per_checkout_and_distinct_between_two():
    first = sandbox_reach.default_data_dir(Path("/root/src/xagent"))
    assert first == sandbox_reach.default_data_dir(Path("/root/src/xagent"))
    assert first != sandbox_reach.default_data_dir(Path("/root/other/xagent"))
    assert first.name.startswith("xagent-")
    if IS_ROOT:
        assert first.parent == sandbox_reach.SYSTEM_PARENT


def test_the_data_dir_is_made_searchable_but_not_listable_with_its_subdirectories(open_dir):
    data = sandbox_reach.prepare_data_dir(open_dir / "data")

    assert mode(data) == 0o711
    assert {p.name: mode(p) for p in data.iterdir()} == {
        "workspaces": 0o711,
        "mcp-servers": 0o711,
        "python": 0o711,
    }
    assert sandbox_reach.prepare_data_dir(data) == data  # again: used as it is


@root_only
def test_a_data_dir_the_sandbox_cannot_reach_stops_the_process_naming_the_variable(private_dir):
    with pytest.raises(
        ImproperlyConfigured, match=rf"XAGENT_SANDBOX_DATA_DIR: .*cannot search {private_dir}"
    ):
        sandbox_reach.prepare_data_dir(private_dir / "data")


@root_only
def test_a_data_dir_of_another_owner_is_refused_and_left_alone(open_dir):
    theirs = open_dir / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)

    with pytest.raises(ImproperlyConfigured, match="not a directory owned by this user"):
        sandbox_reach.prepare_data_dir(theirs)
    assert mode(theirs) == 0o700 and not any(theirs.iterdir())


def test_a_relative_data_dir_is_refused():
    with pytest.raises(ImproperlyConfigured, match="not an absolute path"):
        sandbox_reach.prepare_data_dir(Path("var/sandbox"))


def test_the_banner_says_nothing_when_the_defaults_stay(settings):
    settings.XAGENT_SANDBOX_DEFAULTS_MOVED = False
    assert sandbox_data_notes() == []


def test_the_banner_names_the_moved_roots_why_and_earlier_workspaces(settings, private_dir, open_dir):
    checkout = private_dir / "checkout"
    (checkout / "var" / "workspaces" / "1").mkdir(parents=True)
    settings.VAR_DIR = checkout / "var"
    settings.XAGENT_SANDBOX_DEFAULTS_MOVED = True
    settings.XAGENT_SANDBOX_DATA_DIR = open_dir
    settings.XAGENT_WORKSPACES_DIR = open_dir / "workspaces"
    settings.XAGENT_MCP_SERVERS_DIR = Path("/srv/xagent/mcp-servers")  # set by the operator: not moved

    (notes, earlier) = sandbox_data_notes()

    assert notes.startswith(f"Sandbox data: Session workspaces in {open_dir / 'workspaces'} (")
    assert "mcp-servers" not in notes
    assert f"cannot search {private_dir}" in notes
    assert (
        earlier
        == f"Workspaces of earlier runs stay in {checkout / 'var' / 'workspaces'} (move them to use them)"
    )
