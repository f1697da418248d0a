"""What a rank publishes: one shape of perf record, and no record lost to a failed publish."""

from __future__ import annotations

import time
import warnings
from typing import Any

import pytest

from dtwork.errors import DtworkWarning
from dtwork.runtime.core import publish
from dtwork.runtime.core.publish import Publisher
from dtwork.shared.records import make_perf_record


class Transport:
    """Stands in for ipyparallel's datapub: refuses while ``down``, else keeps what it got."""

    def __init__(self) -> None:
        self.down = False
        self.sent: list[dict[str, Any]] = []

    def __call__(self, data: dict[str, Any]) -> None:
        if self.down:
            raise OSError("socket closed")
        self.sent.append(data)

    def steps(self) -> list[int]:
        """The steps of every record received, in key order (as the kernel reads them)."""
        batches = [recs for data in self.sent for key, recs in sorted(data.items()) if key.startswith("r")]
        return [rec["step"] for recs in batches for rec in recs]


@pytest.fixture
def transport(monkeypatch: pytest.MonkeyPatch) -> Transport:
    out = Transport()
    monkeypatch.setattr(publish, "_publish", out)
    return out


def test_a_failed_publish_warns_once_and_keeps_the_records(transport: Transport, capsys: Any) -> None:
    pub = Publisher(0, interval=3600.0)
    transport.down = True
    pub.record("log", 0, {"loss": 1.0})
    with pytest.warns(
        DtworkWarning, match=r"rank 0 could not send its records .*OSError: socket closed.*kept"
    ):
        pub.flush()
    pub.record("log", 1, {"loss": 0.5})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once, not at every flush
        pub.flush()
    assert pub.unsent == 2 and transport.sent == []
    transport.down = False
    pub.record("log", 2, {"loss": 0.25})
    pub.flush()
    assert transport.steps() == [0, 1, 2] and pub.unsent == 0
    assert "rank 0 publishes its records again" in capsys.readouterr().err
    pub.record("log", 3, {"loss": 0.1})
    pub.flush()  # what was sent is not sent again
    assert transport.steps() == [0, 1, 2, 3]


def test_kept_records_are_bounded_oldest_dropped_first(transport: Transport, capsys: Any) -> None:
    pub = Publisher(0, interval=3600.0, max_kept=4)
    transport.down = True
    with pytest.warns(DtworkWarning, match="up to 4, oldest dropped first"):
        for step in range(5):
            pub.record("log", 2 * step, {"a": 1.0})
            pub.record("log", 2 * step + 1, {"a": 1.0})
            pub.flush()
    assert pub.unsent == 4 and pub.dropped == 6
    transport.down = False
    pub.flush()
    assert transport.steps() == [6, 7, 8, 9]
    assert "(6 older ones were dropped)" in capsys.readouterr().err


def test_outside_an_engine_nothing_is_sent_or_kept() -> None:
    pub = Publisher(0, interval=3600.0)
    pub.record("log", 0, {"loss": 1.0})
    pub.flush()  # the real transport: no kernel shell in this process
    assert pub.unsent == 0 and pub.failing is None


def test_one_shape_of_perf_record() -> None:
    loop = make_perf_record(5, 1, samples=640, seconds=2.0, steps=10, comm=0.5, data=0.3)
    assert loop["kind"] == "perf" and loop["step"] == 5 and loop["rank"] == 1
    assert loop["values"] == pytest.approx(
        {"samples_per_s": 320.0, "step_time": 0.2, "comm_time": 0.05, "data_time": 0.03, "compute_time": 0.12}
    )
    hand = make_perf_record(5, 1, samples=640, seconds=2.0, steps=10, comm=0.5)  # data loading unseen
    assert hand["values"] == pytest.approx({"samples_per_s": 320.0, "step_time": 0.2, "comm_time": 0.05})
    assert make_perf_record(0, 0, samples=0, seconds=0.0, steps=0, comm=0.0)["values"]["samples_per_s"] == 0.0


def test_a_new_cell_does_not_send_the_last_cells_progress_again(transport: Transport) -> None:
    pub = Publisher(rank=0, interval=0.0)
    pub.progress(step=600, phase="done")
    pub.new_cell()  # idle time, then a cell that logs: its age would read as a stall
    pub.record("log", 0, {"x": 1.0})
    assert [d.get("progress", {}).get("step") for d in transport.sent] == [600, None]


def test_a_blocked_ranks_newest_progress_reaches_the_kernel_without_its_records(transport: Transport) -> None:
    """A rank that recorded its step and then blocked (in a collective, waiting for a stalled rank)
    makes no more calls: the keeper thread sends that progress, so the watchdog compares the steps
    the ranks reached; the records stay for the rank's own next flush."""
    pub = Publisher(0, interval=0.5, keeper=True)
    pub.flush()
    pub.record("log", 7, {"loss": 1.0})
    pub.progress(step=7, phase="train")  # then the rank blocks: no call of its own for a long time
    deadline = time.monotonic() + 60
    while not any(d.get("progress", {}).get("step") == 7 for d in transport.sent):
        assert time.monotonic() < deadline, "the newest progress never left the blocked rank"
        time.sleep(0.02)
    assert pub.send_progress_if_stuck() is False  # sent once, not at every interval
    keeper_sent = [d for d in transport.sent if not any(k.startswith("r") for k in d)]
    assert all(set(d) == {"progress"} for d in keeper_sent)
    pub.flush()
    assert transport.steps() == [7] and pub.unsent == 0
