"""One scenario on one database, in a process of its own: `python -m bench.child <scenario> <options>`.

The parent (`python -m bench`) gives it the environment of the database under test (see
bench.backends); it prints one line `BENCH-RESULT <json>` with the scenario's figures.
A separate process per scenario keeps peak RSS, caches and connections from leaking between them.
"""

from __future__ import annotations

import json
import sys
import traceback

RESULT_PREFIX = "BENCH-RESULT "


def main(argv: list[str]) -> int:
    scenario_name, options = argv[0], json.loads(argv[1])
    import django

    django.setup()
    from .probe import QUERIES
    from .scenarios import SCENARIOS

    QUERIES.install()
    try:
        result = SCENARIOS[scenario_name].run(options)
    except Exception as exc:
        traceback.print_exc()
        result = {"error": f"{exc.__class__.__name__}: {exc}"}
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
