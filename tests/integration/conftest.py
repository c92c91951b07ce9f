"""What several integration modules share: a real Celery worker process on the test database."""

import time

import pytest

from .processes import database_env_for_workers, running, worker_command


@pytest.fixture
def worker(tmp_path):
    log = tmp_path / "worker.log"
    with running(worker_command("rt"), database_env_for_workers(), log) as proc:
        proc.log_path = log
        yield proc


def wait_for(predicate, worker, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert worker.poll() is None, worker.log_path.read_text(errors="replace")
        time.sleep(0.1)
    raise AssertionError(f"timed out; worker log:\n{worker.log_path.read_text(errors='replace')[-4000:]}")
