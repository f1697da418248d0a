"""Runs as TensorBoard event files, written with the tensorboard package's own event writer.

``export_tensorboard`` writes runs from the store; ``live_tensorboard`` is called by the kernel's
session with each batch of records it has stored, when the config names ``tensorboard: DIR`` (never
on the ranks). Each run gets a folder ``<dir>/run-<id>-<name>`` holding its aggregated metrics as scalars at
their steps (training logs, throughput, GNS), its scaling sweeps as ``scaling/<mode>/<field>``
scalars at step = number of ranks, and its hyperparameters and config through the HParams plugin.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dtwork.export import RunView, require, run_view, select_runs
from dtwork.store.runs import RunStore

__all__ = ["export_tensorboard", "live_tensorboard", "run_folder"]

_SCALING_FIELDS = ("throughput", "step_time", "comm_time")


def run_folder(run_id: int, name: str | None) -> str:
    """The folder name of a run: ``run-<id>-<name>`` with the name made safe for a path."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name or "").strip("._")
    return f"run-{run_id}-{safe}"[:120] if safe and safe != f"run-{run_id}" else f"run-{run_id}"


def export_tensorboard(
    store: RunStore | str | os.PathLike[str],
    directory: str | os.PathLike[str],
    run_id: int | str | None = None,
) -> list[Path]:
    """Write run ``run_id`` (every run when None) under ``directory``; return the run folders."""
    require("tensorboard", "tensorboard")
    own = not isinstance(store, RunStore)
    rs = RunStore(store, readonly=True) if not isinstance(store, RunStore) else store
    try:
        return [_write(run_view(rs, rid), Path(directory)) for rid in select_runs(rs, run_id)]
    finally:
        if own:
            rs.close()


def _write(view: RunView, directory: Path) -> Path:
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.plugins.hparams import summary_v2 as hp
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    folder = directory / run_folder(view.id, view.name)
    folder.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(folder))
    try:
        session = hp.hparams_pb(dict(view.params), trial_id=f"run-{view.id}", start_time_secs=view.created_at)
        writer.add_event(event_pb2.Event(wall_time=view.created_at, step=0, summary=session))
        for name, step, value, wall in view.metrics:
            summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=name, simple_value=value)])
            writer.add_event(event_pb2.Event(wall_time=wall or view.created_at, step=step, summary=summary))
        for point in view.scaling:
            values = [
                summary_pb2.Summary.Value(
                    tag=f"scaling/{point['mode']}/{key}", simple_value=float(point[key])
                )
                for key in _SCALING_FIELDS
                if isinstance(point.get(key), (int, float))
            ]
            step = int(point.get("world_size", 0))
            writer.add_event(
                event_pb2.Event(
                    wall_time=view.created_at, step=step, summary=summary_pb2.Summary(value=values)
                )
            )
    finally:
        writer.close()
    return folder


_LIVE: dict[str, tuple[int, Any]] = {}  # directory -> (run id, its open EventFileWriter)


_FAILED: set[str] = set()  # directories that could not be written: said once, then left alone


def live_tensorboard(
    directory: str, run_id: int, name: str | None, records: Sequence[Mapping[str, object]]
) -> None:
    """Append the aggregated values of ``records`` to run ``run_id``'s event file under ``directory``.

    Never raises: training and the store go on when TensorBoard cannot be written (said once).
    """
    key = os.path.abspath(directory)
    if key in _FAILED:
        return
    try:
        _live(key, run_id, name, records)
    except Exception as exc:  # the live view is a convenience; the store already holds the records
        _FAILED.add(key)
        print(f"dtwork: tensorboard: {directory}: live scalars stop here ({type(exc).__name__}: {exc})")


def _live(key: str, run_id: int, name: str | None, records: Sequence[Mapping[str, object]]) -> None:
    require("tensorboard", "tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    from dtwork.shared.records import to_rows

    rows = [row for row in to_rows(records) if row["rank"] is None and row["value"] is not None]
    if not rows:
        return
    held = _LIVE.get(key)
    if held is None or held[0] != run_id:
        if held is not None:
            held[1].close()  # the run before this one is over
        folder = Path(key) / run_folder(run_id, name)
        folder.mkdir(parents=True, exist_ok=True)
        held = _LIVE[key] = (run_id, EventFileWriter(str(folder)))
    writer = held[1]
    for row in rows:
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=row["name"], simple_value=row["value"])]
        )
        writer.add_event(
            event_pb2.Event(wall_time=row["time"] or time.time(), step=row["step"], summary=summary)
        )
    writer.flush()
