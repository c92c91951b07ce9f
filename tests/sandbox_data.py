"""One sandbox data directory per test run (`XAGENT_SANDBOX_DATA_DIR`, config/sandbox_reach.py).

Run as root from a checkout the sandbox uids cannot reach (a `mktemp -d` folder, /root/…), the
product keeps the workspaces' and MCP servers' default roots, and copies of the packages a
sandboxed server imports, in that directory instead of under the checkout. A test run must
neither leave them in /var/lib/xagent nor share them with another run, so the first process of a
run (the pytest-xdist controller, or the only process) makes a fresh one in the temp directory,
0711, and removes it when it exits; the runners and every process a test starts inherit the
variable. A variable already set is left alone, and without root nothing uses it.

Loaded with `-p tests.sandbox_data` (pyproject addopts), before pytest-django imports the settings.
"""

import atexit
import os
import shutil
import tempfile

VARIABLE = "XAGENT_SANDBOX_DATA_DIR"


def _make() -> None:
    if os.geteuid() != 0 or os.environ.get(VARIABLE):
        return
    path = tempfile.mkdtemp(prefix="xagent-sandbox-data-")
    os.chmod(path, 0o711)
    os.environ[VARIABLE] = path
    # At exit rather than in a pytest hook: also when the run stops before it is configured.
    atexit.register(shutil.rmtree, path, ignore_errors=True)


_make()
