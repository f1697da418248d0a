"""The record of an experiment tells the truth while it is iterated (issue 33): no false alarm
after a failed cell, no silent unwrapped model, non-finite values kept and named, the learning rate
the optimizer has, dtwork's own measurements apart, interrupted loops named, what each cell ran with.

Its tests that need no engines; the others are in tests/cluster/test_record_truth.py.
"""

from __future__ import annotations


def test_verify_compares_every_logged_metric_at_every_step() -> None:
    import math

    from dtwork.report.verify import compare

    def rows(**series: list[float]) -> list[dict[str, object]]:
        return [
            {"kind": "log", "step": s, "name": n, "value": v}
            for n, vs in series.items()
            for s, v in enumerate(vs)
        ]

    recorded = rows(loss=[1.0, 0.5, math.nan], acc=[0.1, 0.2, 0.3])
    assert compare(recorded, rows(loss=[1.0, 0.5, math.nan], acc=[0.1, 0.2, 0.3])) == {
        "loss": 0.0,
        "acc": 0.0,
    }
    assert compare(recorded, rows(loss=[1.0, 0.5], acc=[0.1, 0.2, 0.3]))["loss"] == math.inf  # a step missing
    assert compare(recorded, rows(loss=[1.0, 0.5, math.nan]))["acc"] == math.inf  # a metric missing
    extra = compare(recorded, rows(loss=[1.0, 0.5, math.nan], acc=[0.1, 0.2, 0.3], lr=[0.1, 0.1, 0.1]))
    assert extra["lr"] == math.inf  # logged by the re-run only
    assert (
        compare(recorded, rows(loss=[1.0, 0.5, 0.25], acc=[0.1, 0.2, 0.3]))["loss"] == math.inf
    )  # nan vs finite


def test_first_non_finite_reads_logged_values_only_and_skips_malformed_records() -> None:
    import math

    from dtwork.shared.records import first_non_finite

    records: list[object] = [
        "not a record",
        {"kind": "gns", "step": 1, "values": {"g2": math.nan}},  # dtwork's own: not a divergence
        {"kind": "log", "step": 2, "values": ["not", "a", "mapping"]},
        {"kind": "log", "step": 3, "values": {"loss": 0.5, "acc": "x"}},
        {"kind": "log", "step": 4, "values": {"loss": -math.inf}},
    ]
    assert first_non_finite(records) == (4, "loss", -math.inf)  # type: ignore[arg-type]
    assert first_non_finite(records[:4]) is None  # type: ignore[arg-type]
