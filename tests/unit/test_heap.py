"""A rank freezes its import-time heap once, and never what a cell made (runtime/core/heap.py)."""

from __future__ import annotations

import gc
import importlib.util
import weakref
from types import ModuleType

import dtwork.runtime.core.heap as shared_heap


def _fresh() -> ModuleType:
    """A heap module of its own, as a new rank has it (the shared one may have seen a cell)."""
    spec = importlib.util.spec_from_file_location("heap_copy", shared_heap.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Model:
    """A user's model in a reference cycle, as nn.Modules with hooks often are."""

    def __init__(self) -> None:
        self.me = self


def test_a_cell_s_dropped_cycle_is_still_collected_after_the_late_freeze() -> None:
    heap = _fresh()
    heap.cell_begins()
    model = _Model()
    gone = weakref.ref(model)
    assert not heap.freeze_imports()  # the warm imports end after the cell began: no freeze
    del model
    gc.collect()
    assert gone() is None


def test_what_exists_before_the_first_cell_is_frozen() -> None:
    heap = _fresh()
    before = gc.get_freeze_count()
    kept = _Model()
    assert heap.freeze_imports()
    assert gc.get_freeze_count() > before
    del kept
