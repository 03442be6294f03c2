"""Side-by-side latency of the compose e2e (scripts/compose_e2e.sh, step 5): `bench load` results against the
container and against `trtllm-pipeline serve` on the host, several rounds each, interleaved.

    python scripts/compose_e2e_latency.py CONTAINER.json... -- HOST.json...

Prints, per figure, the median over rounds of each side's p50 and the container / host ratio.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

FIGURES = (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "e2e"))


def p50s(paths: list[str], figure: str) -> list[float]:
    values = []
    for path in paths:
        [point] = json.loads(Path(path).read_text())["points"]  # one endpoint, one concurrency
        values.append(float(point[figure]["p50"]))
    return values


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    split = argv.index("--")
    container, host = argv[:split], argv[split + 1 :]
    print("| p50 (ms), median of rounds | container | host `serve` | container / host |")
    print("|---|---|---|---|")
    for figure, label in FIGURES:
        inside, outside = statistics.median(p50s(container, figure)), statistics.median(p50s(host, figure))
        print(f"| {label} | {inside:.2f} | {outside:.2f} | {inside / outside:.2f} |")
    print(f"rounds: {len(container)} container, {len(host)} host (interleaved)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
