"""What a cell trained with, as it left it: sent to the kernel with the cell's own messages.

The cell's first rank publishes it (datapub, under ``records.SETTINGS_KEY``) in IPython's
``post_run_cell`` event, so that the kernel's per-cell record of what ran costs no request of its own.
"""

from __future__ import annotations

from collections.abc import Mapping

from dtwork import runtime
from dtwork.runtime.core import control, effective_args
from dtwork.runtime.core.payloads import CellSettings, ModelSettings, OptimizerSettings, Setting
from dtwork.shared.records import SETTINGS_KEY

_sends: list[bool] = [False]  # whether this rank is the running cell's first, which sends them


def install() -> None:
    """Send the settings after every shown cell that ends well on the cell's first rank."""
    shell = control.get_shell()
    if shell is not None and not getattr(shell, "_dtwork_cell_settings", False):
        shell.events.register("pre_run_cell", _cell_begins)
        shell.events.register("post_run_cell", _cell_ran)
        shell._dtwork_cell_settings = True


def _cell_begins(info: object = None) -> None:
    ranks = control.cell_ranks()  # set by control's own pre_run_cell hook, registered before this one
    _sends[0] = runtime.joined() and runtime.current().rank == (min(ranks) if ranks else 0)


def _cell_ran(result: object = None) -> None:
    if not _sends[0] or not getattr(result, "success", False):
        return
    try:
        settings = cell_settings()
        if any(settings.values()):  # a cell that used none of them has nothing to record (the report's rule)
            runtime.current().state.publisher.send({SETTINGS_KEY: settings})
    except Exception:  # the settings are a courtesy: the cell's own outcome stands
        pass


def cell_settings() -> CellSettings:
    """What the last cell trained with, as it left it: whether each wrapped model it used measures
    the noise scale, and each optimizer it used: class and hyperparameters by parameter group."""
    from dtwork.runtime.measure.ddp_hooks import measure_state

    state = runtime.current().state
    models: list[ModelSettings] = [
        {"gns": bool(s.gns)} for m in state.used_now("models") if (s := measure_state(m)) is not None
    ]
    optimizers: list[OptimizerSettings] = [
        {"class": type(opt).__name__, "groups": [_plain_settings(g) for g in opt.param_groups]}
        for opt in state.used_now("optimizers")
    ]
    return {"models": models, "optimizers": optimizers, "calls": effective_args.of_cell(state)}


def _plain_settings(group: Mapping[str, object]) -> dict[str, Setting]:
    """A parameter group's hyperparameters that a report can print (numbers, flags, names)."""
    out: dict[str, Setting] = {}
    for key, value in group.items():
        numel = getattr(value, "numel", None)
        if numel is not None and numel() == 1:  # a tensor learning rate (no torch import here)
            value = value.item()  # type: ignore[attr-defined]
        if isinstance(value, (tuple, list)) and all(isinstance(v, (int, float)) for v in value):
            value = list(value)
        if key != "params" and isinstance(value, (bool, int, float, str, list, type(None))):
            out[key] = value
    return out
