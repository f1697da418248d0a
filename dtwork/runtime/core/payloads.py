"""What crosses between the kernel and a rank: the requests the kernel sends, what the entry points
return (``runtime.entry``). Plain dicts on the wire (ipyparallel pickles them); typed here."""

from __future__ import annotations

from typing import TypedDict

from dtwork.shared.devices import Device

Plain = bool | int | float | str | list[bool | int | float | str]  # a value a report prints as it is
Setting = bool | int | float | str | list[object] | None  # a parameter group's hyperparameter, as printed


class ProcessId(TypedDict):
    """A process told apart from a later one with its PID: its PID and start time."""

    pid: int
    create_time: float


class _EngineProbe(TypedDict):
    hostname: str
    pid: int
    create_time: float
    parent: ProcessId
    addresses: dict[str, list[str]]  # IPv4 addresses by interface name
    gpus: list[Device]  # the GPUs this engine may use, in CUDA_VISIBLE_DEVICES order
    cuda_visible_devices: str | None
    slurm_localid: int | None


class EngineProbe(_EngineProbe, total=False):
    """``entry.probe``: an engine before it joins; torch's facts only where it sees a GPU."""

    torch: str
    torch_cuda: bool


class _RankSpec(TypedDict):
    rank: int
    world_size: int
    local_rank: int
    backend: str
    master_addr: str
    master_port: int
    timeout: float  # seconds for the group's collectives and its rendezvous


class RankSpec(_RankSpec, total=False):
    """``entry.init_rank``'s request: the rank's place in the group, its device, the shared settings."""

    gpu: int | None  # the physical GPU index, None on CPU
    gpu_uuid: str | None
    local_world_size: int
    group_rank: int  # the host's index (torchrun's node rank)
    group_world_size: int
    interface: str | None
    run_id: str  # the cluster's id (torchrun's run id for scripts)
    global_batch_size: int | None
    config: dict[str, object] | None  # ExperimentConfig.to_dict()


class GpuFacts(TypedDict):
    gpu_name: str | None
    gpu_uuid: str | None


class RankJoined(GpuFacts):
    """``entry.init_rank``: what the rank ended up with; ``warnings``: dtwork's, for the kernel."""

    rank: int
    device: str
    pid: int
    global_batch_size: int | None
    warnings: list[str]


class ConfigApplied(TypedDict):
    """``entry.set_config``: the batch a config implies on this rank, and dtwork's warnings."""

    per_slot_batch_size: int | None
    global_batch_size: int | None
    warnings: list[str]


class ModelSettings(TypedDict):
    gns: bool  # whether the model measures the noise scale


# "class" is a keyword: this one is spelled in the functional form
OptimizerSettings = TypedDict("OptimizerSettings", {"class": str, "groups": list[dict[str, Setting]]})


class CellSettings(TypedDict):
    """``cell_settings.cell_settings``: what the last cell trained with, as it left it."""

    models: list[ModelSettings]
    optimizers: list[OptimizerSettings]
    calls: dict[str, dict[str, Plain]]  # the ctx helpers it called, with their effective arguments
