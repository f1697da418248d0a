"""The long-run phase (opt-in, so the smoke run never drives it) still writes through the real writer
and the live view's data side, and times every reader, at its smallest: 1 rank, just past its 10-minute reading."""

from __future__ import annotations

from pathlib import Path

from benchmarks import long_run


def test_the_long_run_phase_writes_its_rows_and_times_every_reader(tmp_path: Path) -> None:
    r = long_run.measure(0.17, 1, tmp_path)
    per_second = 10 * 5 + 5 + 4 * 3  # perf at 10 Hz, telemetry at 1 Hz, 3 user metrics at 4 steps/s
    assert r["rows_written"] == int(0.17 * 3600) * per_second
    for when in ("after_10_min", "at_end"):
        assert set(r[when]) == {
            "sidebar_list_s",
            "run_card_s",
            "reopened_figure_s",
            "runs_show_s",
            "report_export_s",
            "store_mib",
        }
        assert all(v > 0 for v in r[when].values())
    # the live view took every record too, and the process's CPU for both is reported
    assert r["live_view_held"] > 0 and 0 < r["kernel_cpu_share"] < 1
