"""The Celery application (`celery -A config worker`).

Settings live in `config/settings.py` under the `CELERY_` prefix. Agent work is long and
must survive a worker dying mid-task, hence acks_late + reject_on_worker_lost + prefetch 1.
Tasks have explicit names and take ids only (STYLE §7).
"""

import os
import sys

from celery import Celery
from celery.signals import (
    worker_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

PING_CACHE_PREFIX = "xagent:ping:"


@app.task(name="config.ping", ignore_result=True)
def ping(nonce: str) -> str:
    """Prove a worker consumes from the broker: leave `pong` in the shared cache under the nonce.

    The cache (Redis in production, process memory in embedded mode, where the worker
    shares the web process) is how a caller sees the answer without a result backend.
    """
    from django.core.cache import cache

    cache.set(PING_CACHE_PREFIX + nonce, "pong", timeout=60)
    return "pong"


@worker_init.connect
def _bound_database_connections(**kwargs):
    """Before the worker's first query: its threads share XAGENT_WORKER_DB_CONNECTIONS pooled
    connections (config/dbconn.py), whatever its concurrency."""
    from django.conf import settings

    from config.dbconn import set_pool_size

    set_pool_size(settings.XAGENT_WORKER_DB_CONNECTIONS)


@worker_ready.connect
def _recover_on_start(sender, **kwargs):
    """A restarted worker picks up Sessions whose runner died with the previous process: now (a
    lease holder whose process is gone is recognised at once, runtime/presence.py), and again
    once a lease without a known holder must have lapsed (rather than at the next beat)."""
    from django.conf import settings

    from sessions_app.runtime import presence

    presence.ensure_started()
    sender.app.send_task("sessions.recover")
    sender.app.send_task("sessions.recover", countdown=settings.XAGENT_RUNNER_LEASE_SECONDS + 1)


@worker_shutdown.connect
def _leave_on_shutdown(sender, **kwargs):
    """A clean stop removes this process's presence row: leases it still holds are taken over at
    the next sweep instead of after the presence timeout."""
    from sessions_app.runtime import presence

    presence.stop_presence()


@worker_process_shutdown.connect
def _close_mcp_sessions(**kwargs):
    """A pool process exits without running atexit handlers: close its pooled MCP sessions, so
    no stdio server process outlives it."""
    from tools_app.mcp.pool import close_pool

    close_pool()


@worker_shutting_down.connect
def _hand_over_on_shutdown(sender, **kwargs):
    """A deploy's SIGTERM (warm shutdown): slices running in this process stop at their next step
    boundary and re-enqueue their Sessions, so another worker goes on at once and nothing waits
    for a lease to lapse.

    Sent in the worker's main process, so it reaches slices of the threads and solo pools;
    prefork children finish their (bounded) slice and hand over as they always do. A cold
    shutdown (SIGQUIT) sends it only after worker_soft_shutdown_timeout, as it cancels tasks:
    what it cuts short is taken over once the lease lapses.
    """
    # Runs inside the signal handler: no imports here. A process that never loaded brain never
    # ran a slice, so there is nothing to hand over.
    brain = sys.modules.get("sessions_app.runtime.brain")
    if brain is not None:
        brain.hand_over_slices()
