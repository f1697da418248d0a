"""What a cell ran with, kept in the store for the report: its options and the settings it left."""

from __future__ import annotations

from dtwork.kernel.watcher import CellResult
from dtwork.shared.records import CELL_SETTINGS
from dtwork.store.runs import STORE_ERRORS, RunStore


def record(store: RunStore, run_id: int, seq: int, rank0: bool, result: CellResult) -> None:
    """Keep the cell's options and, when it ended well, the settings it left (sent by its first rank
    with the cell's messages, ``runtime.cell_settings``)."""
    data: dict[str, object] = {"seq": seq, "rank0": rank0}
    if not result.errors and result.settings is not None:
        data.update(result.settings)
    try:
        store.add_result(run_id, CELL_SETTINGS, data)
    except STORE_ERRORS:
        pass
