"""Run every MCP client conformance scenario against `manage.py mcp_probe` (`make conformance`).

The suite is the npm package `@modelcontextprotocol/conformance`, pinned by package.json and
package-lock.json beside this file and installed with `npm ci` outside the repo tree (var/ by
default, `CONFORMANCE_DIR` to move it). For each scenario the package starts its own test servers
on loopback, runs our command with the server URL as the last argument and
`MCP_CONFORMANCE_SCENARIO` / `MCP_CONFORMANCE_CONTEXT` set, and judges the exchange: exit 0 means
every check passed and the client exited 0.

`expected.toml` says which scenarios must pass and why the others are not expected to. Every
scenario is run (in parallel: each starts its servers on free ports). An expected scenario that
fails makes this exit 1 with its output's tail; one that passes without being expected, or one
the file does not name, is a notice so the file can be tightened.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXPECTED = HERE / "expected.toml"
PINNED = ("package.json", "package-lock.json")
# The client-ID metadata document URL the suite's `auth/basic-cimd` scenario expects as the
# client ID (its own constant); other scenarios' servers do not support such documents, so the
# SDK registers dynamically there.
CLIENT_METADATA_URL = "https://conformance-test.local/client-metadata.json"
# The suite's default is 30 s; a Django management command spends several seconds just starting,
# more on a loaded CI machine, so a scenario gets longer before the suite calls it timed out.
SCENARIO_TIMEOUT_MS = 120_000
TAIL_LINES = 40


@dataclass
class Outcome:
    scenario: str
    passed: bool
    checks: dict[str, int]
    output: str
    seconds: float


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", action="append", default=[], help="run only this scenario (repeatable)")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 2, help="scenarios run at once (default: one per CPU)"
    )
    parser.add_argument("--no-install", action="store_true", help="use the installed package as it is")
    args = parser.parse_args()

    install_dir = Path(os.environ.get("CONFORMANCE_DIR") or ROOT / "var" / "conformance")
    if not args.no_install:
        install(install_dir)
    cli = install_dir / "node_modules" / ".bin" / "conformance"
    if not cli.exists():
        print(
            f"conformance: the suite is not installed in {install_dir} (run without --no-install)",
            file=sys.stderr,
        )
        return 2

    expected = tomllib.loads(EXPECTED.read_text())
    must_pass = set(expected["pass"]["scenarios"])
    excluded = dict(expected["excluded"])
    available = list_scenarios(cli)
    stale = sorted((must_pass | set(excluded)) - set(available))
    if stale:
        print(
            f"conformance: expected.toml names scenarios the suite does not have: {', '.join(stale)}",
            file=sys.stderr,
        )
        return 2
    chosen = args.scenario or available
    unknown = sorted(set(chosen) - set(available))
    if unknown:
        print(f"conformance: no such scenario: {', '.join(unknown)}", file=sys.stderr)
        return 2

    command = " ".join(
        shlex.quote(part)
        for part in (
            sys.executable,
            str(ROOT / "manage.py"),
            "mcp_probe",
            "--skip-checks",  # the system checks say nothing about the probe and cost a second each run
            "--client-metadata-url",
            CLIENT_METADATA_URL,
        )
    )
    results_dir = install_dir / "results"
    shutil.rmtree(results_dir, ignore_errors=True)
    results_dir.mkdir(parents=True)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = list(pool.map(lambda s: run_scenario(cli, command, s, results_dir), chosen))

    return report(outcomes, must_pass, excluded, results_dir)


def install(install_dir: Path) -> None:
    """`npm ci` of the pinned package into `install_dir`, unless that exact lock is installed."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            sys.exit(f"conformance: {tool} is not installed (Node.js 20 or newer is needed)")
    install_dir.mkdir(parents=True, exist_ok=True)
    installed = (install_dir / "node_modules" / ".bin" / "conformance").exists() and all(
        (install_dir / name).exists() and filecmp.cmp(HERE / name, install_dir / name, shallow=False)
        for name in PINNED
    )
    if installed:
        return
    for name in PINNED:
        shutil.copyfile(HERE / name, install_dir / name)
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    print(f"conformance: installing the pinned suite into {install_dir} (node {node})", flush=True)
    done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=install_dir)
    if done.returncode != 0:
        sys.exit(f"conformance: npm ci failed (exit {done.returncode}) in {install_dir}")


def list_scenarios(cli: Path) -> list[str]:
    listed = subprocess.run([str(cli), "list", "--client"], capture_output=True, text=True, check=True).stdout
    return [line.strip()[2:] for line in listed.splitlines() if line.strip().startswith("- ")]


def run_scenario(cli: Path, command: str, scenario: str, results_dir: Path) -> Outcome:
    out = Path(tempfile.mkdtemp(prefix=scenario.replace("/", "_") + "-", dir=results_dir))
    argv = [str(cli), "client", "--command", command, "--scenario", scenario]
    argv += ["--timeout", str(SCENARIO_TIMEOUT_MS), "-o", str(out)]
    started = time.monotonic()
    try:
        done = subprocess.run(
            argv,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=SCENARIO_TIMEOUT_MS / 1000 + 60,
        )
        passed, output = done.returncode == 0, done.stdout
    except subprocess.TimeoutExpired as exc:
        passed, output = False, f"{exc.stdout or ''}\n(the runner itself did not finish in {exc.timeout:g} s)"
    checks: dict[str, int] = {}
    for path in out.rglob("checks.json"):
        for check in json.loads(path.read_text()):
            checks[check["status"]] = checks.get(check["status"], 0) + 1
    (out / "runner-output.txt").write_text(output)
    return Outcome(scenario, passed, checks, output, time.monotonic() - started)


def report(outcomes: list[Outcome], must_pass: set[str], excluded: dict[str, str], results_dir: Path) -> int:
    broken = [o for o in outcomes if o.scenario in must_pass and not o.passed]
    width = max(len(o.scenario) for o in outcomes)
    print(f"\n{'scenario':<{width}}  result  seconds  checks ok/failed/warned  expectation")
    for o in outcomes:
        if o.scenario in must_pass:
            expectation = "must pass" + ("  <-- FAILED" if not o.passed else "")
        elif o.scenario in excluded:
            expectation = f"excluded: {excluded[o.scenario]}"
        else:
            expectation = "not in expected.toml"
        counts = "/".join(str(o.checks.get(k, 0)) for k in ("SUCCESS", "FAILURE", "WARNING"))
        result = "pass" if o.passed else "FAIL"
        print(f"{o.scenario:<{width}}  {result:<6}  {o.seconds:>7.1f}  {counts:<22}  {expectation}")
    passed = sum(o.passed for o in outcomes)
    required = sum(o.scenario in must_pass for o in outcomes)
    print(f"\n{passed} of {len(outcomes)} scenarios passed; {required} of them must. Results: {results_dir}")

    for o in outcomes:
        if o.passed and o.scenario not in must_pass:
            print(f"notice: {o.scenario} passed but is not expected to: move it to [pass] in {EXPECTED.name}")
        if o.scenario not in must_pass and o.scenario not in excluded:
            print(f"notice: {o.scenario} is new: classify it in {EXPECTED.name}")
    for o in broken:
        tail = "\n".join(o.output.rstrip().splitlines()[-TAIL_LINES:])
        print(f"\n=== {o.scenario} FAILED (expected to pass); last {TAIL_LINES} lines of its output:\n{tail}")
    if broken:
        print(f"\nconformance FAILED: {', '.join(o.scenario for o in broken)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
