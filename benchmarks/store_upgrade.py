"""What moving an older store's metric rows into schema 7 costs: ``python -m benchmarks.store_upgrade
MILLIONS [PATH]`` writes a version-6 store of that many rows (8 ranks' step times and 3 user metrics a
step, in one run), opens it with write access as dtwork does, and prints the upgrade's seconds and the
file's size before and after. Not a phase of the suite: an upgrade happens once per store."""

from __future__ import annotations

import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

# The metrics table and index of version 6, in place of the view and tables of version 7.
TO_V6 = """
DROP VIEW metrics;
DROP TABLE points;
DROP TABLE metric_keys;
DROP TABLE counters;
CREATE TABLE metrics (run_id INTEGER NOT NULL, cell_seq INTEGER, step INT NOT NULL, rank INT,
    name TEXT NOT NULL, value REAL, time REAL, kind TEXT NOT NULL DEFAULT 'log');
CREATE INDEX metrics_run_name_rank_step ON metrics (run_id, name, rank, step);
PRAGMA user_version = 6;
"""

_ROWS = """
INSERT INTO metrics (run_id, cell_seq, step, rank, name, value, time, kind)
WITH RECURSIVE i(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM i WHERE x < ? - 1)
SELECT 1, 1 + x / 1000000, x / 12, CASE WHEN x % 12 < 3 THEN NULL ELSE x % 8 END,
    CASE x % 12 WHEN 0 THEN 'loss' WHEN 1 THEN 'accuracy' WHEN 2 THEN 'grad_norm' ELSE 'step_time' END,
    (x % 997) * 0.01, 1.7e9 + x * 0.01, CASE WHEN x % 12 < 3 THEN 'log' ELSE 'perf' END FROM i
"""


def measure(rows: int, path: Path) -> dict[str, float]:
    from dtwork.store.runs import RunStore

    with RunStore(path) as store:
        store.create_run(world_size=8, backend="nccl")
    conn = sqlite3.connect(path)
    conn.executescript(TO_V6)
    conn.execute(_ROWS, (rows,))
    conn.commit()
    conn.close()
    before = path.stat().st_size / 2**20
    t0 = time.perf_counter()
    with RunStore(path) as store:
        seconds = time.perf_counter() - t0
        moved = store.db.connection().execute("SELECT COUNT(*) FROM points").fetchone()[0]
    assert moved == rows, (moved, rows)
    return {"rows": rows, "seconds": seconds, "v6_mib": before, "after_mib": path.stat().st_size / 2**20}


if __name__ == "__main__":
    n = round(float(sys.argv[1]) * 1e6)
    with tempfile.TemporaryDirectory() as d:
        where = Path(sys.argv[2]) if len(sys.argv) > 2 else Path(d) / "runs.sqlite"
        print(json.dumps(measure(n, where), indent=1))
