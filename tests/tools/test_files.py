import os

import pytest

from tools_app.base import ToolError
from tools_app.native.files import FsDeleteFiles, FsEdit, FsList, FsRead, FsWrite
from tools_app.workspace import MAX_READ_BYTES, MAX_WRITE_BYTES

fs_list, fs_read, fs_write, fs_edit, fs_delete = FsList(), FsRead(), FsWrite(), FsEdit(), FsDeleteFiles()


def refused(tool, ctx, args) -> ToolError:
    with pytest.raises(ToolError) as caught:
        tool.run(ctx, args)
    return caught.value


# --- fs_write -------------------------------------------------------------------------------


def test_write_creates_parents_and_reports_created_then_modified(ctx, workspace, port):
    first = fs_write.run(ctx, {"path": "docs/notes/a.md", "content": "hello\n"})
    second = fs_write.run(ctx, {"path": "docs/notes/a.md", "content": "bye\n"})

    assert (workspace / "docs/notes/a.md").read_text() == "bye\n"
    assert first.data["op"] == "created" and "created docs/notes/a.md" in first.content
    assert second.data["op"] == "modified"
    assert port.file_changes == [("docs/notes/a.md", "created"), ("docs/notes/a.md", "modified")]


def test_write_keeps_content_exactly(ctx, workspace):
    fs_write.run(ctx, {"path": "crlf.txt", "content": "a\r\nb\r\n€"})

    assert (workspace / "crlf.txt").read_bytes() == "a\r\nb\r\n€".encode()


def test_write_refuses_oversized_content(ctx, workspace, port):
    error = refused(fs_write, ctx, {"path": "big.txt", "content": "x" * (MAX_WRITE_BYTES + 1)})

    assert error.code == "too_large"
    assert not (workspace / "big.txt").exists()
    assert port.file_changes == []


def test_write_refuses_a_directory(ctx, workspace):
    (workspace / "d").mkdir()

    assert refused(fs_write, ctx, {"path": "d", "content": "x"}).code == "is_a_directory"


def test_writing_through_a_symlinked_directory_outside_is_refused(ctx, workspace, host, port):
    os.symlink(host, workspace / "out")

    for path in ["out/evil.txt", "out/secret.txt", "out/new/evil.txt"]:
        assert refused(fs_write, ctx, {"path": path, "content": "pwned"}).code == "path_escape"

    assert sorted(p.name for p in host.iterdir()) == ["secret.txt"]
    assert (host / "secret.txt").read_text() == "host secret\n"
    assert port.file_changes == []


def test_a_symlinked_file_outside_is_refused_by_every_file_tool(ctx, workspace, host, port):
    os.symlink(host / "secret.txt", workspace / "link.txt")

    assert refused(fs_read, ctx, {"path": "link.txt"}).code == "path_escape"
    assert refused(fs_write, ctx, {"path": "link.txt", "content": "pwned"}).code == "path_escape"
    assert (
        refused(fs_edit, ctx, {"path": "link.txt", "old_text": "host", "new_text": "x"}).code == "path_escape"
    )
    assert refused(fs_delete, ctx, {"paths": ["link.txt"]}).code == "path_escape"

    assert (host / "secret.txt").read_text() == "host secret\n"
    assert port.file_changes == []


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../x"])
def test_escaping_paths_are_refused_and_nothing_is_written(ctx, tmp_path, path):
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    assert refused(fs_write, ctx, {"path": path, "content": "pwned"}).code == "path_escape"
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_writing_through_a_symlink_inside_reports_the_real_file(ctx, workspace, port):
    (workspace / "real.txt").write_text("old")
    os.symlink(workspace / "real.txt", workspace / "alias.txt")

    fs_write.run(ctx, {"path": "alias.txt", "content": "new"})

    assert (workspace / "real.txt").read_text() == "new"
    assert port.file_changes == [("real.txt", "modified")]


# --- fs_read --------------------------------------------------------------------------------


def test_read_numbers_lines_and_pages(ctx, workspace):
    (workspace / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))

    whole = fs_read.run(ctx, {"path": "f.txt"})
    page = fs_read.run(ctx, {"path": "f.txt", "offset": 3, "limit": 2})

    assert whole.content.splitlines()[0] == "     1\tline 1"
    assert len(whole.content.splitlines()) == 10
    assert page.content.splitlines() == [
        "     3\tline 3",
        "     4\tline 4",
        "…[lines 3-4 of 10 shown; call fs_read with offset=5 to continue]",
    ]
    assert page.summary == "read f.txt (lines 3-4 of 10)"


def test_read_caps_output_and_says_where_to_continue(ctx, workspace):
    (workspace / "long.txt").write_text("".join("y" * 3000 + "\n" for _ in range(50)))

    result = fs_read.run(ctx, {"path": "long.txt"})

    assert len(result.content) < 20_000
    assert "[line truncated: 1000 more characters]" in result.content
    assert "call fs_read with offset=" in result.content.splitlines()[-1]


def test_read_refuses_binary_files(ctx, workspace):
    (workspace / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    (workspace / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))

    assert refused(fs_read, ctx, {"path": "img.png"}).code == "binary_file"
    error = refused(fs_read, ctx, {"path": "latin1.txt"})
    assert error.code == "binary_file" and "not UTF-8" in str(error)


def test_read_refuses_oversized_files(ctx, workspace):
    (workspace / "big.txt").write_bytes(b"x" * (MAX_READ_BYTES + 1))

    error = refused(fs_read, ctx, {"path": "big.txt"})

    assert error.code == "too_large" and "limit" in str(error)


def test_read_errors_for_missing_files_directories_and_bad_offsets(ctx, workspace):
    (workspace / "d").mkdir()
    (workspace / "two.txt").write_text("a\nb\n")

    assert refused(fs_read, ctx, {"path": "missing.txt"}).code == "not_found"
    assert refused(fs_read, ctx, {"path": "d"}).code == "is_a_directory"
    assert refused(fs_read, ctx, {"path": "two.txt", "offset": 3}).code == "bad_offset"


def test_read_of_an_empty_file(ctx, workspace):
    (workspace / "empty.txt").write_text("")

    assert "empty" in fs_read.run(ctx, {"path": "empty.txt"}).content


# --- fs_edit --------------------------------------------------------------------------------


def test_edit_replaces_a_unique_occurrence(ctx, workspace, port):
    (workspace / "app.py").write_text("a = 1\nb = 2\n")

    result = fs_edit.run(ctx, {"path": "app.py", "old_text": "b = 2", "new_text": "b = 3"})

    assert (workspace / "app.py").read_text() == "a = 1\nb = 3\n"
    assert "line 2" in result.content
    assert port.file_changes == [("app.py", "modified")]


def test_edit_errors_when_old_text_is_missing_or_ambiguous(ctx, workspace, port):
    (workspace / "app.py").write_text("x = 1\nx = 1\n")

    assert (
        refused(fs_edit, ctx, {"path": "app.py", "old_text": "y", "new_text": "z"}).code == "edit_not_found"
    )
    ambiguous = refused(fs_edit, ctx, {"path": "app.py", "old_text": "x = 1", "new_text": "x = 2"})
    assert ambiguous.code == "edit_ambiguous" and "2 times" in str(ambiguous)
    assert (workspace / "app.py").read_text() == "x = 1\nx = 1\n"
    assert port.file_changes == []


def test_edit_replace_all(ctx, workspace):
    (workspace / "app.py").write_text("x = 1\nx = 1\n")

    result = fs_edit.run(
        ctx, {"path": "app.py", "old_text": "x = 1", "new_text": "x = 2", "replace_all": True}
    )

    assert (workspace / "app.py").read_text() == "x = 2\nx = 2\n"
    assert result.data["replacements"] == 2


def test_edit_refuses_missing_files(ctx):
    assert refused(fs_edit, ctx, {"path": "nope.py", "old_text": "a", "new_text": "b"}).code == "not_found"


# --- fs_list --------------------------------------------------------------------------------


def test_list_shows_the_tree_and_a_subdirectory(ctx, workspace):
    (workspace / "src").mkdir()
    (workspace / "src/app.py").write_text("x")
    (workspace / "README.md").write_text("hi")

    everything = fs_list.run(ctx, {})
    sub = fs_list.run(ctx, {"path": "src"})

    assert everything.content.splitlines() == ["README.md  (2 B)", "src/", "src/app.py  (1 B)"]
    assert sub.content.splitlines() == ["src/app.py  (1 B)"]


def test_list_of_an_empty_workspace_and_a_missing_directory(ctx):
    assert fs_list.run(ctx, {}).content == "the workspace is empty"
    assert refused(fs_list, ctx, {"path": "nope"}).code == "not_found"
    assert refused(fs_list, ctx, {"path": "../"}).code == "path_escape"


# --- fs_delete_files ------------------------------------------------------------------------


def test_delete_removes_files_and_reports_each(ctx, workspace, port):
    (workspace / "a.txt").write_text("a")
    (workspace / "d").mkdir()
    (workspace / "d/b.txt").write_text("b")

    result = fs_delete.run(ctx, {"paths": ["a.txt", "d/b.txt"]})

    assert not (workspace / "a.txt").exists() and not (workspace / "d/b.txt").exists()
    assert port.file_changes == [("a.txt", "deleted"), ("d/b.txt", "deleted")]
    assert result.summary == "deleted 2 files"


def test_delete_checks_every_path_before_deleting_any(ctx, workspace, port):
    (workspace / "a.txt").write_text("a")
    (workspace / "d").mkdir()

    assert refused(fs_delete, ctx, {"paths": ["a.txt", "missing.txt"]}).code == "not_found"
    assert refused(fs_delete, ctx, {"paths": ["a.txt", "d"]}).code == "is_a_directory"
    assert refused(fs_delete, ctx, {"paths": ["a.txt", "."]}).code == "is_a_directory"
    assert (workspace / "a.txt").exists()
    assert port.file_changes == []


def test_deleting_a_symlink_inside_removes_the_link_not_its_target(ctx, workspace, port):
    (workspace / "real.txt").write_text("keep")
    os.symlink(workspace / "real.txt", workspace / "alias.txt")

    fs_delete.run(ctx, {"paths": ["alias.txt"]})

    assert not (workspace / "alias.txt").is_symlink()
    assert (workspace / "real.txt").read_text() == "keep"
    assert port.file_changes == [("alias.txt", "deleted")]
