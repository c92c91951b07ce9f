"""What a sandboxed process may do: `SandboxLimits`, one immutable value per run.

The Django model `SandboxPolicy` maps onto it field for field (`SandboxLimits(**fields)`), so
the validation lives here and a bad row fails loudly (ValueError) instead of running a command
with a limit nobody meant. Limits are per run:

- `filesystem`: "workspace_write" binds the workspace read-write at /workspace,
  "read_only" binds it read-only. Nothing else of the host is writable in either case.
- `network`: False gives the sandbox its own empty network namespace (not even the host's
  loopback); True keeps that namespace and adds egress through the outbound guard: a proxy the
  sandbox reaches at 127.0.0.1 inside its namespace (`sandbox.egress`), which refuses loopback,
  private, link-local and metadata addresses unless the operator allow-lists them.
- `host_network`: share the host's network namespace (operator-only: `SandboxPolicy` honours it
  only on a row an operator configured). Never reached from a tenant's settings.
- `cpu_seconds` (RLIMIT_CPU, per process), `memory_mb` (RLIMIT_AS, address space per process),
  `max_processes` (RLIMIT_NPROC for the sandbox uid), `max_file_size_mb` (RLIMIT_FSIZE).
- `wall_seconds`: the whole run, after which every process of it is killed.
- `max_output_bytes`: kept of stdout and of stderr each; the rest is read and dropped, and a
  run that keeps flooding (OUTPUT_FLOOD_FACTOR times the cap in total) is stopped.
- Ceilings: the operator's `XAGENT_SANDBOX_CEILINGS` bound every policy (`within_ceilings`).
- `fallback`: what to do where bubblewrap cannot run: "refuse" (default) or "rlimits_only"
  (run with the uid drop and rlimits but no namespaces; logged, and reported `sandboxed=False`).
  Operator-only, like `host_network`: a tenant's policy always refuses.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal

FILESYSTEM_MODES = ("read_only", "workspace_write")
FALLBACK_MODES = ("refuse", "rlimits_only")

# Inclusive bounds per integer field: generous, but they stop typos (a limit of 0, or a
# memory limit in bytes where megabytes were meant) from reaching the kernel.
INT_BOUNDS: dict[str, tuple[int, int]] = {
    "cpu_seconds": (1, 86_400),
    "memory_mb": (16, 1_048_576),
    "wall_seconds": (1, 86_400),
    "max_processes": (1, 10_000),
    "max_file_size_mb": (1, 1_048_576),
    "max_output_bytes": (1_000, 100_000_000),
}


@dataclass(frozen=True)
class SandboxLimits:
    filesystem: Literal["read_only", "workspace_write"] = "workspace_write"
    network: bool = False
    host_network: bool = False
    cpu_seconds: int = 30
    memory_mb: int = 1024
    wall_seconds: int = 60
    max_processes: int = 64
    max_file_size_mb: int = 50
    max_output_bytes: int = 200_000
    fallback: Literal["refuse", "rlimits_only"] = "refuse"

    def __post_init__(self) -> None:
        if self.filesystem not in FILESYSTEM_MODES:
            raise ValueError(f"filesystem must be one of {FILESYSTEM_MODES}, not {self.filesystem!r}")
        if self.fallback not in FALLBACK_MODES:
            raise ValueError(f"fallback must be one of {FALLBACK_MODES}, not {self.fallback!r}")
        for name in ("network", "host_network"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, not {getattr(self, name)!r}")
        for name, (low, high) in INT_BOUNDS.items():
            value = getattr(self, name)
            # bool is an int subclass; True as "cpu_seconds" is a mistake, not 1 second.
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, not {value!r}")
            if not low <= value <= high:
                raise ValueError(f"{name} must be between {low} and {high}, not {value}")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


DEFAULT_LIMITS = SandboxLimits()


def within_ceilings(limits: SandboxLimits, ceilings: dict[str, int]) -> SandboxLimits:
    """`limits` with every integer limit at most the operator's ceiling for it."""
    clamped = {
        name: min(getattr(limits, name), ceiling)
        for name, ceiling in ceilings.items()
        if name in INT_BOUNDS and getattr(limits, name) > ceiling
    }
    return replace(limits, **clamped) if clamped else limits
