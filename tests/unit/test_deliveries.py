"""Each rank's batch is stored once: the marks written with its rows, the journal a rank keeps of its
cell (bounded in memory, the rest spilled to a file), and a kernel that attached reading from it
what its store lacks over the real side channel. No engines: the session's store path, for real."""

from __future__ import annotations

import socket
import sqlite3
import stat
from pathlib import Path

import pytest

from dtwork.config import ExperimentConfig
from dtwork.kernel import journals
from dtwork.kernel.engines import EngineGroup
from dtwork.kernel.session import Session
from dtwork.kernel.spec import ClusterSpec
from dtwork.kernel.stacks import StackChannels
from dtwork.runtime.core.journal import Journal
from dtwork.runtime.debug import stacks
from dtwork.shared.records import Record, batch_key, batch_mark, make_record
from dtwork.store.runs import RunStore
from dtwork.store.schema import SCHEMA_VERSION
from dtwork.store.writer import StoreWriter


def _batch(step: int, rank: int = 0) -> list[Record]:
    return [make_record("log", step, rank, {"loss": float(step)})]


def _losses(path: Path, run: int) -> list[int]:
    with RunStore(path, readonly=True) as s:
        return [int(r["step"]) for r in s.metrics(run, "loss")]


def _session(tmp_path: Path) -> tuple[Session, int, int]:
    """A session on a real store (its engines never started), its run and a running cell."""
    path = tmp_path / "runs.sqlite"
    engines = EngineGroup(ClusterSpec(n=1, backend="gloo"), config=ExperimentConfig(), store_file=path)
    session = Session(engines, path)
    run = session.store.create_run(world_size=1, backend="gloo")
    session.run_id = run
    return session, run, session.store.add_cell(run, "%%dtrain\ntrain()")


def test_a_batch_key_names_its_rank_stream_and_seq() -> None:
    assert batch_mark(1, batch_key(7, "abc")) == (1, "abc", 7)
    assert sorted([batch_key(10, "z"), batch_key(9, "z")])[0] == batch_key(9, "z")  # by seq
    assert batch_mark(0, "progress") is None and batch_mark(0, "r12") is None


def test_the_journal_keeps_a_cell_bounded_in_memory_and_spills_the_rest(tmp_path: Path) -> None:
    journal = Journal(0, max_memory=10, folder=str(tmp_path))
    for seq in range(20):
        journal.add(seq, [*_batch(seq), *_batch(seq)])  # two records a batch
    assert sum(len(b) for _, b in journal._held) <= 10 and journal.spilled == 15
    assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600  # the user's records, the user's file
    every = journal.since(-1, 1000)
    assert [seq for seq, _ in every["batches"]] == list(range(20)) and every["more"] is False
    page = journal.since(12, 4)  # past a seq, a page at a time
    assert [seq for seq, _ in page["batches"]] == [13, 14] and page["more"] is True
    assert journal.since(-1, 0)["batches"] == [] and journal.ended is None
    stream = journal.stream
    journal.end(ValueError("boom"))
    assert journal.since(-1, 0)["ended"] == {"status": "error", "error": "ValueError: boom"}
    journal.begin()  # the next cell: a new stream, nothing kept, the file gone
    assert journal.stream != stream and journal.since(-1, 1000)["batches"] == []
    assert not journal.path.exists() and journal.ended is None


def test_a_mark_is_written_in_the_transaction_of_its_rows(tmp_path: Path) -> None:
    session, run, cell = _session(tmp_path)
    conn = sqlite3.connect(tmp_path / "runs.sqlite")
    conn.execute(
        "CREATE TRIGGER full BEFORE INSERT ON deliveries BEGIN SELECT RAISE(ABORT, 'disk full'); END"
    )
    conn.commit()
    session.persist(_batch(0), cell, [(0, "s", 0)])
    session.writer.flush(force=True)  # the mark fails after the rows went in: neither stays
    assert session.writer.problem is not None and _losses(tmp_path / "runs.sqlite", run) == []
    assert session.store.delivered(0, "s") is None and session.writer.fresh((0, "s", 0)) is False  # queued
    conn.execute("DROP TRIGGER full")
    conn.commit()
    assert session.writer.flush(force=True)
    assert _losses(tmp_path / "runs.sqlite", run) == [0]
    assert session.store.delivered(0, "s") == {
        "rank": 0,
        "stream": "s",
        "run_id": run,
        "cell_seq": cell,
        "seq": 0,
    }
    assert session.writer.fresh((0, "s", 0)) is False and session.writer.fresh((0, "s", 1)) is True
    conn.close()


@pytest.fixture
def side_channel(tmp_path: Path):  # type: ignore[no-untyped-def]  # a generator fixture
    """This process's side channel, answering from a journal as a rank's does."""
    journal = Journal(0, folder=str(tmp_path), max_memory=4)
    port = stacks.serve("secret", "127.0.0.1")
    stacks.answer_records(journal.since)
    yield journal, StackChannels("secret", {0: ("127.0.0.1", port)})
    stacks.answer_records(lambda after, most: {})


def test_an_attaching_kernel_stores_what_the_store_lacks_once_and_the_cells_end(
    tmp_path: Path, side_channel: tuple[Journal, StackChannels]
) -> None:
    journal, channels = side_channel
    session, run, cell = _session(tmp_path)
    journal.begin()
    for seq in range(10):
        journal.add(seq, _batch(seq))
    # The dead kernel stored batches 0-3 as they came; it died before the rest arrived.
    session.persist([r for seq in range(4) for r in _batch(seq)], cell, [(0, journal.stream, 3)])
    session.writer.flush(force=True)
    journal.end(None)
    journals.recover(session, run, channels, [0])
    assert _losses(tmp_path / "runs.sqlite", run) == list(range(10))  # every step once
    with RunStore(tmp_path / "runs.sqlite", readonly=True) as s:
        assert [(c["status"], c["error"]) for c in s.cells(run)] == [("ok", None)]
        assert any("6 batches the ranks kept" in e["message"] for e in s.events(run)), s.events(run)
    # Read again (a second attach): every batch is stored already, none goes in twice.
    assert journals._store_batches(session, session.store.cells(run)[0], channels, 0, journal.stream) == 0
    assert _losses(tmp_path / "runs.sqlite", run) == list(range(10))


def test_a_cell_that_failed_on_a_rank_is_recorded_as_failed(
    tmp_path: Path, side_channel: tuple[Journal, StackChannels]
) -> None:
    journal, channels = side_channel
    session, run, cell = _session(tmp_path)
    journal.begin()
    journal.add(0, _batch(0))
    journal.end(RuntimeError("nan in the loss"))
    journals.recover(session, run, channels, [0])
    with RunStore(tmp_path / "runs.sqlite", readonly=True) as s:
        assert [(c["status"], c["error"]) for c in s.cells(run)] == [
            ("error", "rank 0: RuntimeError: nan in the loss")
        ]
        assert s.get_run(run)["status"] == "failed"
    assert _losses(tmp_path / "runs.sqlite", run) == [0]


def test_a_cell_the_ranks_never_ran_is_closed_as_interrupted(
    tmp_path: Path, side_channel: tuple[Journal, StackChannels]
) -> None:
    journal, channels = side_channel
    journal.begin()
    journal.add(0, _batch(0))
    journal.end(None)
    journal.started -= 60  # the ranks' last cell began before the store's running one
    session, run, _ = _session(tmp_path)
    journals.recover(session, run, channels, [0])
    with RunStore(tmp_path / "runs.sqlite", readonly=True) as s:
        assert [c["status"] for c in s.cells(run)] == ["interrupted"]
        assert "could not say how it ended" in str(s.cells(run)[0]["error"])
    assert _losses(tmp_path / "runs.sqlite", run) == []


def test_an_older_store_gets_the_deliveries_table_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with RunStore(path) as store:
        run = store.create_run(world_size=1, backend="gloo")
        store.add_metrics(run, [{"step": 0, "name": "loss", "value": 1.0}])
    conn = sqlite3.connect(path)
    conn.executescript("DROP TABLE deliveries; PRAGMA user_version = 4;")
    conn.close()
    with RunStore(path) as store:
        assert store.db.connection().execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert [r["value"] for r in store.metrics(run, "loss")] == [1.0]
        assert store.series(run)[0]["n"] == 1  # its rollups were not built a second time
        store.mark_delivered(run, 1, [(0, "s", 2)])
        assert store.delivered(0, "s") is not None


def test_a_writer_keeps_a_refused_batch_and_its_mark_together(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    with RunStore(path) as store:
        run = store.create_run(world_size=1, backend="gloo")
        writer = StoreWriter(lambda: store, path, say=lambda line: None)
        blocker = sqlite3.connect(path, timeout=0)
        blocker.execute("BEGIN IMMEDIATE")  # another program holds the write lock
        store.db.connection().execute("PRAGMA busy_timeout = 10")
        with writer.holding:
            writer.records(run, 1, _batch(5))
            writer.mark(run, 1, [(0, "s", 5)])
        assert writer.flush(force=True) is False and writer.unsaved == 1
        blocker.rollback()
        blocker.close()
        assert writer.flush(force=True) and store.delivered(0, "s") is not None
        assert [r["step"] for r in store.metrics(run, "loss")] == [5]


def test_a_cell_whose_ranks_do_not_answer_is_closed_as_interrupted(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nobody listens on once it is closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    session, run, _ = _session(tmp_path)
    journals.recover(session, run, StackChannels("secret", {0: ("127.0.0.1", port)}), [0])
    with RunStore(tmp_path / "runs.sqlite", readonly=True) as s:
        assert [c["status"] for c in s.cells(run)] == ["interrupted"]
