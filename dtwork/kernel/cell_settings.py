"""What a cell ran with, kept in the store for the report: its options and the settings it left."""

from __future__ import annotations

from dtwork.kernel.engines import EngineGroup
from dtwork.kernel.watcher import CellResult
from dtwork.shared.records import CELL_SETTINGS
from dtwork.store.runs import STORE_ERRORS, RunStore

SETTINGS_SECONDS = 10.0  # for rank 0's answer about the settings a cell left, once the cell ended


def record(
    engines: EngineGroup, store: RunStore, run_id: int, seq: int, rank0: bool, result: CellResult
) -> None:
    """Keep the cell's options and, when the ranks can be asked (no error left them busy), the
    settings it left (``entry.cell_settings``, asked with the cell)."""
    data: dict[str, object] = {"seq": seq, "rank0": rank0}
    asked = result.settings
    if not result.errors and asked is not None and engines.state == "running":
        try:
            data.update(asked.get(timeout=SETTINGS_SECONDS)[0])
        except Exception:  # the settings are a courtesy: the cell's own outcome stands
            pass
    try:
        store.add_result(run_id, CELL_SETTINGS, data)
    except STORE_ERRORS:
        pass
