"""`manage.py runstack`: the whole product in one process tree.

Embedded mode (REDIS_URL unset): daphne (HTTP + WebSockets) and an in-process Celery
worker on the in-memory broker. Production (REDIS_URL set): daphne only; workers run
as `celery -A config worker` and `celery -A config beat`.
"""

import logging
import os
import sys
from pathlib import Path

from channels.routing import get_default_application
from daphne.endpoints import build_endpoint_description_strings
from daphne.server import Server
from django.conf import settings
from django.core.management.base import BaseCommand

from config import sandbox_reach
from config.embedded import start_embedded_worker, stop_embedded_worker
from sessions_app.runtime import brain, presence

logger = logging.getLogger(__name__)


def sandbox_data_notes() -> list[str]:
    """What the banner says when a root process keeps the sandbox's data outside this checkout
    (config/sandbox_reach.py): where, why, and where earlier runs' workspaces stay."""
    if not settings.XAGENT_SANDBOX_DEFAULTS_MOVED:
        return []
    data_dir = Path(settings.XAGENT_SANDBOX_DATA_DIR)
    moved = [
        f"{what} in {path}"
        for what, path in (
            ("Session workspaces", Path(settings.XAGENT_WORKSPACES_DIR)),
            ("stdio MCP servers' directories", Path(settings.XAGENT_MCP_SERVERS_DIR)),
        )
        if path.parent == data_dir
    ]
    old_root = Path(settings.VAR_DIR) / "workspaces"
    blocked = sandbox_reach.unsearchable_parent(old_root)
    notes = [
        f"Sandbox data: {'; '.join(moved)} (the sandbox user cannot search {blocked}, above this "
        "checkout; README, Troubleshooting)"
    ]
    if old_root.is_dir() and any(old_root.iterdir()):
        notes.append(f"Workspaces of earlier runs stay in {old_root} (move them to use them)")
    return notes


class Command(BaseCommand):
    help = "Serve the web app (daphne) and, in embedded mode, an in-process Celery worker."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, host, port, **options):
        if settings.EMBEDDED:
            start_embedded_worker()
            # No beat in embedded mode: this process sweeps for lost runners itself (and its
            # presence row says it is alive while it runs slices).
            presence.ensure_started()
            brain.start_recovery_timer()
            mode = "embedded: SQLite/in-process worker/in-memory channel layer"
        else:
            mode = "web only: run workers with `celery -A config worker` and `celery -A config beat`"
        display_host = f"[{host}]" if ":" in host else host
        url = f"http://{display_host}:{port}/"

        def announce():
            self.stdout.write(f"xAgent workspace running at {url} ({mode})")
            for line in sandbox_data_notes():
                self.stdout.write(line)
            sys.stdout.flush()

        Server(
            application=get_default_application(),
            endpoints=build_endpoint_description_strings(host=host, port=port),
            ready_callable=announce,
            verbosity=0,
        ).run()
        # daphne has stopped (SIGINT/SIGTERM): stop the in-process worker before the interpreter
        # goes away under it.
        if settings.EMBEDDED:
            self._stop_embedded_worker()

    def _stop_embedded_worker(self) -> None:
        timeout = settings.CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT
        try:
            stopped = stop_embedded_worker(timeout)
        except KeyboardInterrupt:  # a second Ctrl+C: stop waiting
            stopped = False
        if stopped:
            return
        logger.warning(
            "a runner slice was still busy after %.0f s; it is left for recovery at the next start", timeout
        )
        sys.stdout.flush()
        sys.stderr.flush()
        # The pool's threads are not daemons, so a normal exit would wait for that step, and a
        # slice going on during interpreter shutdown fails noisily. Its lease lapses; the next
        # start takes it over and closes what it left open (brain.drive). Nothing is lost.
        os._exit(0)
