"""The README's curl tour runs as written (issue #27): every shell block the README marks
`<!-- quickstart -->` runs, in order and unchanged but for the address, with bash from the
repository root against a live embedded stack (`runstack` after `seed_demo`, as `make run`
serves it) — `.venv/bin/python manage.py create_api_key` included, on that stack's database."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .processes import PROJECT_ROOT, embedded_env, served_embedded

README = Path(PROJECT_ROOT) / "README.md"
DOCUMENTED_BASE = "http://127.0.0.1:8000"
QUICKSTART = re.compile(r"^<!-- quickstart -->\n```sh\n(.*?)^```", re.M | re.S)

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="the README's tour uses curl")


def quickstart_blocks() -> list[str]:
    return QUICKSTART.findall(README.read_text())


def test_the_readme_marks_its_quickstart():
    blocks = quickstart_blocks()
    assert len(blocks) >= 3
    script = "\n".join(blocks)
    assert f"BASE={DOCUMENTED_BASE}" in script and "create_api_key" in script


def test_the_readme_quickstart_runs_against_a_live_stack(tmp_path):
    script = "\n".join(quickstart_blocks())
    env = embedded_env(tmp_path)
    with served_embedded(tmp_path, ("seed_demo",), env=env) as stack:
        run = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script.replace(DOCUMENTED_BASE, stack.base)],
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert run.returncode == 0, f"{run.stderr}\n{run.stdout}"
    bodies = list(json_bodies(run.stdout))
    assert not [body for body in bodies if "error" in body], run.stdout
    me, queued, events, messages, uploaded, tree, deliveries = bodies
    assert me["tenant"]["slug"] == "demo" and me["auth"] == "api_key"
    assert queued["status"] == "queued"
    assert events["events"] and events["last_seq"] >= events["events"][-1]["seq"]
    assert "results" in messages and "results" in deliveries
    assert uploaded["path"] == "tickets.csv" and uploaded["name_changed"] is False
    assert "tickets.csv" in [entry["path"] for entry in tree]


def json_bodies(text: str):
    """The JSON bodies curl printed one after another (the API ends none with a newline)."""
    decoder, position = json.JSONDecoder(), 0
    while position < len(text.rstrip()):
        body, position = decoder.raw_decode(text, position)
        yield body
        while position < len(text) and text[position].isspace():
            position += 1
