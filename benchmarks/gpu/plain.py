"""``python -m benchmarks.gpu.plain PORT DEVICE PLAN SIZES``: the plain job of the GPU turns, one process.

Runs ``workload.SOURCE``'s ``serve`` with no dtwork (the bare loop on ``DEVICE``), then prints the
workloads' facts as ``FACTS <json>``. PLAN and SIZES are JSON (see ``drive.turns``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from benchmarks.gpu.workload import SOURCE


def main(argv: list[str]) -> int:
    port, device, plan, sizes = int(argv[0]), argv[1], json.loads(argv[2]), json.loads(argv[3])
    ns: dict[str, Any] = {}
    exec(SOURCE, ns)
    facts = ns["serve"](port, "plain", plan, sizes, device)
    print("FACTS " + json.dumps(facts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
