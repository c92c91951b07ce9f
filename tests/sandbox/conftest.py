"""What the sandbox tests share: a directory tree the sandbox uids can search."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tools_app.workspace import workspace_for


@pytest.fixture
def shared_tmp():
    """A directory tree the sandbox uids can search, as the real workspaces root is (pytest's
    tmp_path lives under a root-only directory, which the sandbox refuses: see test_sandbox)."""
    path = Path(tempfile.mkdtemp(prefix="xagent-sbx-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def workspace(shared_tmp: Path) -> Path:
    return workspace_for(shared_tmp / "workspaces", "acme", "session-1")
