"""Start a sandbox chain for a process spawned by code that cannot hand it file descriptors.

The MCP SDK starts a stdio server itself (`anyio.open_process`, which closes every descriptor
but stdin/stdout/stderr), yet bwrap reads its options from a descriptor (`--args FD`, so the
secret environment values in them never appear on a command line) and its /etc/passwd from
others (`--ro-bind-data FD`). So the SDK starts this script instead:

    python -I -S launcher.py  ARGV...        environment: XAGENT_SANDBOX_LAUNCH={"fds", "env", "cwd"}

It turns each `fds` entry (fd number -> base64 bytes) into a memfd at exactly that number,
changes to `cwd` if given, and execs ARGV (an absolute path first) with exactly `env`. After the
exec the description (with any secret in it) is gone from the process: what remains is ARGV,
which holds nothing secret, and the memfds, read by bwrap.

Standard library only, and nothing of the project: it runs with `-I -S` (no site, no PYTHON*
variables, no current directory on the path) in the worker's own interpreter.
"""

import base64
import fcntl
import json
import os
import sys

LAUNCH_VARIABLE = "XAGENT_SANDBOX_LAUNCH"
# Descriptors are first built above this, so moving them to their numbers cannot overwrite one.
STAGING_FLOOR = 100


def main() -> None:
    spec = json.loads(os.environ[LAUNCH_VARIABLE])
    argv = sys.argv[1:]
    if not argv or not os.path.isabs(argv[0]):
        sys.stderr.write("xagent sandbox launcher: an absolute command is required\n")
        sys.exit(125)
    staged = {}
    for number, data in spec.get("fds", {}).items():
        fd = os.memfd_create(f"xagent-sandbox-{number}")
        os.write(fd, base64.b64decode(data))
        os.lseek(fd, 0, os.SEEK_SET)
        staged[int(number)] = _move_up(fd)
    for number, fd in staged.items():
        os.dup2(fd, number, inheritable=True)
        os.close(fd)
    if spec.get("cwd"):
        os.chdir(spec["cwd"])
    os.execve(argv[0], argv, spec["env"])


def _move_up(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, STAGING_FLOOR)
    os.close(fd)
    return high


if __name__ == "__main__":
    main()
