"""Parallel runners (pytest-xdist, `make test` runs several): what each runner must not share.

Loaded with `-p tests.parallel` (pyproject addopts), so it runs before pytest-django imports the
settings and before any test starts a worker, web process or sandbox, all of which inherit this
process's environment. Without xdist (one runner, or `-p no:xdist`) it changes nothing.

- PostgreSQL: pytest-django already gives each runner its own test database (`test_<name>_gw1`).
- Redis: Celery queues, the channel layer and the cache live in one Redis database. Runners
  sharing one would take each other's `drive_session` tasks (a worker started by one runner
  looking for a Session that is in another runner's database) and each other's rate-limit
  counters (row ids repeat across runners' databases). Runner N uses database `base + N`.
- Sandbox uids need nothing here: every running sandbox takes a uid of its own from
  XAGENT_SANDBOX_UIDS with a host-wide lock (tools_app/sandbox/identity.py), so runners never
  share one, and one runner's bounded fork flood neither starves nor shows up in another's.
"""

import os
from urllib.parse import urlsplit, urlunsplit

REDIS_DATABASES = 16  # Redis's default `databases`


def _runner_index() -> int | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... set before plugins load
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else None


def _redis_url_for(url: str, index: int) -> str:
    parts = urlsplit(url)
    base = int(parts.path.strip("/") or 0)
    database = base + index
    if database >= REDIS_DATABASES:
        raise RuntimeError(
            f"REDIS_URL {url!r}: parallel runner {index} would need Redis database {database}; "
            f"point REDIS_URL at a database of at most {REDIS_DATABASES - 1 - index} or run fewer runners"
        )
    return urlunsplit(parts._replace(path=f"/{database}"))


def isolate_runner() -> None:
    index = _runner_index()
    if index is None:
        return
    if os.environ.get("REDIS_URL", "").startswith(("redis://", "rediss://")):
        os.environ["REDIS_URL"] = _redis_url_for(os.environ["REDIS_URL"], index)


isolate_runner()
