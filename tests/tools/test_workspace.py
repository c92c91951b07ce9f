import os
from datetime import datetime

import pytest

from tools_app.base import ToolError
from tools_app.workspace import list_tree, resolve_in_workspace, workspace_for


def test_workspace_for_creates_tenant_and_session_directories(tmp_path):
    path = workspace_for(tmp_path, "acme", 42)

    assert path == tmp_path / "acme" / "42"
    assert path.is_dir()
    assert workspace_for(tmp_path, "acme", 42) == path  # idempotent


@pytest.mark.parametrize("tenant,session", [("..", "s"), ("acme", "../x"), ("a/b", "s"), ("acme", "")])
def test_workspace_for_refuses_unsafe_components(tmp_path, tenant, session):
    with pytest.raises(ValueError):
        workspace_for(tmp_path, tenant, session)


@pytest.mark.parametrize(
    "user_path", ["../x", "/etc/passwd", "a/../../x", "./../x", "a/b/../../../x", "bad\x00name"]
)
def test_it_refuses_escapes(workspace, user_path):
    with pytest.raises(ToolError) as caught:
        resolve_in_workspace(workspace, user_path)

    assert caught.value.code == "path_escape"
    assert caught.value.stage == "resolve_path"


def test_it_allows_dotdot_that_stays_inside(workspace):
    assert resolve_in_workspace(workspace, "a/../b.txt") == workspace.resolve() / "b.txt"
    assert resolve_in_workspace(workspace, ".") == workspace.resolve()
    assert resolve_in_workspace(workspace, "") == workspace.resolve()


def test_it_refuses_a_symlinked_directory_pointing_outside_even_for_new_files(workspace, host):
    os.symlink(host, workspace / "out")

    for user_path in ["out", "out/secret.txt", "out/new.txt", "out/new/deeper/file.txt"]:
        with pytest.raises(ToolError) as caught:
            resolve_in_workspace(workspace, user_path)
        assert caught.value.code == "path_escape", user_path


def test_it_refuses_a_symlinked_file_pointing_outside(workspace, host):
    os.symlink(host / "secret.txt", workspace / "link.txt")

    with pytest.raises(ToolError) as caught:
        resolve_in_workspace(workspace, "link.txt")

    assert caught.value.code == "path_escape"
    assert str(host) not in str(caught.value)  # never reveals the host path


def test_it_refuses_a_dangling_symlink_pointing_outside(workspace, host):
    os.symlink(host / "not-yet.txt", workspace / "dangling.txt")

    with pytest.raises(ToolError) as caught:
        resolve_in_workspace(workspace, "dangling.txt")

    assert caught.value.code == "path_escape"


def test_it_follows_symlinks_that_stay_inside(workspace):
    (workspace / "real").mkdir()
    os.symlink(workspace / "real", workspace / "alias")

    assert resolve_in_workspace(workspace, "alias/f.txt") == workspace.resolve() / "real" / "f.txt"


def test_must_exist_reports_missing_files(workspace):
    with pytest.raises(ToolError) as caught:
        resolve_in_workspace(workspace, "missing.txt", must_exist=True)

    assert caught.value.code == "not_found"


def test_list_tree_lists_relative_sorted_entries_and_skips_links_outside(workspace, host):
    (workspace / "src").mkdir()
    (workspace / "src" / "app.py").write_text("print(1)\n")
    (workspace / "a.txt").write_text("abc")
    os.symlink(host, workspace / "out_dir")
    os.symlink(host / "secret.txt", workspace / "out_file")
    os.symlink(workspace / "a.txt", workspace / "in_link")

    entries = list_tree(workspace)

    assert [e["path"] for e in entries] == ["a.txt", "in_link", "src", "src/app.py"]
    by_path = {e["path"]: e for e in entries}
    assert by_path["a.txt"] == {**by_path["a.txt"], "size": 3, "kind": "file"}
    assert by_path["src"]["kind"] == "dir"
    assert datetime.fromisoformat(by_path["src/app.py"]["modified_at"]).tzinfo is not None


def test_list_tree_does_not_loop_on_a_link_cycle(workspace):
    (workspace / "d").mkdir()
    os.symlink(workspace / "d", workspace / "d" / "again")

    assert [e["path"] for e in list_tree(workspace)] == ["d", "d/again"]
