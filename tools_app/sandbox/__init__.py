"""ProcessSandbox (ARCHITECTURE §7): run shell commands against a Session workspace inside
bubblewrap, as an unprivileged uid, with CPU/memory/process/file-size/wall/output limits; and
start long-running servers (stdio MCP servers) in the same sandbox (`server`)."""

from .policy import DEFAULT_LIMITS, SandboxLimits
from .process import SandboxRun, run_sandboxed

__all__ = ["DEFAULT_LIMITS", "SandboxLimits", "SandboxRun", "run_sandboxed"]
