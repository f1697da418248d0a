"""Determined experiment files as written: the fields that move or change shape before validation.

Determined keeps the global batch in ``hyperparameters.global_batch_size``, writes hyperparameters
either as values or as ``{type: const, val: ...}``, names the checkpoint folder in
``checkpoint_storage`` and sets ``gradient_compression`` with a boolean. ``translate`` rewrites those
into dtwork's fields; fields dtwork has no use for are listed in ``IGNORED`` and noted, not refused.
The mappings rewritten here are parsed YAML, not yet checked: ``Any`` marks that boundary (``_rules``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from dtwork.config._rules import fail, join, show
from dtwork.errors import ConfigError
from dtwork.shared.batch import per_slot

# section path -> Determined fields that dtwork accepts and ignores (it runs cells on its own cluster)
IGNORED: dict[str, tuple[str, ...]] = {
    "": (
        "entrypoint",
        "environment",
        "bind_mounts",
        "scheduling_unit",
        "profiling",
        "labels",
        "project",
        "workspace",
        "debug",
        "slurm",
        "pbs",
        "perform_initial_validation",
        "checkpoint_policy",
        "tensorboard_storage",
        "reproducibility",
        "integrations",
        "log_policies",
        "retention_policy",
        "preemption_timeout",
    ),
    "resources": (
        "resource_pool",
        "max_slots",
        "weight",
        "priority",
        "native_parallel",
        "shm_size",
        "agent_label",
        "devices",
        "is_single_node",
    ),
    "optimizations": ("tensor_fusion_cycle_time", "grad_updates_size_file", "mixed_precision"),
    "searcher": ("max_trials", "max_concurrent_trials", "source_trial_id", "source_checkpoint_uuid"),
}

_SEARCHES = (
    "random",
    "grid",
    "adaptive",
    "adaptive_simple",
    "adaptive_asha",
    "async_halving",
    "pbt",
    "custom",
)
_HP_TYPES = ("const", "int", "double", "log", "categorical")
_HP_KEYS = {"type", "val", "minval", "maxval", "count", "base", "vals"}
_STORAGE_TYPES = ("shared_fs", "directory")
_STORAGE_KEYS = {"type", "host_path", "storage_path", "container_path", "propagation"}
_STORAGE_IGNORED = ("save_experiment_best", "save_trial_best", "save_trial_latest")


def translate(data: Mapping[Any, Any], label: str, notes: list[str]) -> dict[Any, Any]:
    """A copy of ``data`` with Determined's shapes rewritten into dtwork's fields."""
    out = dict(data)
    if isinstance(out.get("hyperparameters"), Mapping):
        out["hyperparameters"] = _constants(out["hyperparameters"], "hyperparameters", label)
        _batch_from_hparams(out, label)
    if "checkpoint_storage" in out:
        _checkpoint_storage(out, label, notes)
    opts = out.get("optimizations")
    if isinstance(opts, Mapping) and isinstance(opts.get("gradient_compression"), bool):
        # Determined's boolean turns on Horovod's fp16 compression.
        out["optimizations"] = {
            **opts,
            "gradient_compression": "fp16" if opts["gradient_compression"] else "none",
        }
    searcher = out.get("searcher")
    if isinstance(searcher, Mapping) and searcher.get("name") in _SEARCHES:
        run = (
            "run the file with %%dtrain search (dtwork.search), each trial a run"
            if searcher["name"] in ("grid", "random", "adaptive_asha", "async_halving")
            else "dtwork runs grid, random and adaptive_asha searches (%%dtrain search) but not this one yet"
        )
        fail(
            label,
            "searcher.name",
            f"{searcher['name']!r} is a hyperparameter search: {run}; or use name: single with constant "
            "hyperparameters",
        )
    return out


def _constants(hparams: Mapping[Any, Any], path: str, label: str) -> dict[Any, Any]:
    """Hyperparameters as plain values: ``{type: const, val: x}`` becomes x; a searched range fails."""
    out: dict[Any, Any] = {}
    for key, value in hparams.items():
        sub = join(path, str(key))
        if _is_spec(value):
            if value["type"] != "const":
                fail(
                    label,
                    sub,
                    f"a searched hyperparameter (type: {value['type']}) needs a search: run the file "
                    f"with %%dtrain search (searcher.name grid or random), or use a constant, e.g. {key}: <value>",
                )
            if "val" not in value:
                fail(label, sub, "type: const needs val: <value>")
            out[key] = value["val"]
        elif isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
            out[key] = _constants(value, sub, label)
        else:
            out[key] = value
    return out


def _is_spec(value: object) -> bool:
    return (
        isinstance(value, Mapping)
        and value.get("type") in _HP_TYPES
        and all(isinstance(k, str) and k in _HP_KEYS for k in value)
    )


def _batch_from_hparams(out: dict[Any, Any], label: str) -> None:
    hp_batch = out["hyperparameters"].get("global_batch_size")
    if hp_batch is None:
        return
    top = out.get("global_batch_size")
    if top is None:
        out["global_batch_size"] = hp_batch
    elif top != hp_batch:
        fail(
            label,
            "global_batch_size",
            f"{show(top)} differs from hyperparameters.global_batch_size {show(hp_batch)}: keep one of them",
        )


def _checkpoint_storage(out: dict[Any, Any], label: str, notes: list[str]) -> None:
    storage = out.pop("checkpoint_storage")
    if storage is None:
        return
    if not isinstance(storage, Mapping):
        fail(label, "checkpoint_storage", f"expected a mapping, got {show(storage)}")
    kind = storage.get("type")
    if kind not in _STORAGE_TYPES:
        fail(
            label,
            "checkpoint_storage.type",
            f"{show(kind)} is not supported yet: use shared_fs (host_path) or directory (container_path)",
        )
    for key in storage:
        if key in _STORAGE_IGNORED:
            notes.append(f"checkpoint_storage.{key}")
        elif key not in _STORAGE_KEYS:
            fail(label, f"checkpoint_storage.{key}", f"unknown key for type {kind}")
    need = "host_path" if kind == "shared_fs" else "container_path"
    base = storage.get(need)
    if not isinstance(base, str) or not base.strip():
        fail(label, f"checkpoint_storage.{need}", f"type {kind} needs {need}: <folder>, got {show(base)}")
    sub = storage.get("storage_path") if kind == "shared_fs" else None
    if sub is not None and not isinstance(sub, str):
        fail(label, "checkpoint_storage.storage_path", f"expected a folder, got {show(sub)}")
    directory = posixpath.join(base, sub) if sub else base
    checkpoint = out.get("checkpoint")
    checkpoint = dict(checkpoint) if isinstance(checkpoint, Mapping) else {}
    if checkpoint.get("directory") not in (None, directory):
        fail(
            label,
            "checkpoint_storage",
            f"names {directory!r} but checkpoint.directory is {show(checkpoint['directory'])}: keep one of them",
        )
    out["checkpoint"] = {**checkpoint, "directory": directory}


def check_slots(slots: int | None, gbs: int | None, gpus: int, backend: str, cores: int) -> None:
    """Fail at once, as Determined's scheduler would report, when ``resources.slots_per_trial`` asks
    for more slots than this machine has (GPUs, or CPU cores for CPU ranks)."""
    on_gpus = backend == "nccl" or (backend == "auto" and gpus > 0)
    have, unit = (gpus, "GPU") if on_gpus else (cores, "CPU core")
    if slots is None or slots <= have:
        return
    split = (
        f" (the global batch {gbs} then splits {per_slot(gbs, have)} per slot)" if gbs and gbs >= have else ""
    )
    raise ConfigError(
        f"resources.slots_per_trial: {slots} is more than the {have} slots ({unit}s) on this machine, "
        f"so the trial cannot be scheduled: start with -n {have}{split}, lower slots_per_trial to {have}, "
        "or use --profile NAME to start engines on more hosts"
    )
