"""Runs as TensorBoard event files, written with the tensorboard package's own event writer.

Each run gets a folder ``<dir>/run-<id>-<name>`` holding its aggregated metrics as scalars at
their steps (training logs, throughput, GNS), its scaling sweeps as ``scaling/<mode>/<field>``
scalars at step = number of ranks, and its hyperparameters and config through the HParams plugin.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dtwork.export import RunView, require, run_view, select_runs
from dtwork.store import RunStore

__all__ = ["export_tensorboard", "run_folder"]

_SCALING_FIELDS = ("throughput", "step_time", "comm_time")


def run_folder(view: RunView) -> str:
    """The folder name of a run: ``run-<id>-<name>`` with the name made safe for a path."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", view.name).strip("._") or "run"
    return f"run-{view.id}" if safe == f"run-{view.id}" else f"run-{view.id}-{safe}"[:120]


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

    folder = directory / run_folder(view)
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
