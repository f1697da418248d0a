"""What a cluster is started with: ``ClusterSpec``, the one home of the start options.

``%dtrain start`` builds its parser from it (``start_flags``) and its parsed options into one
(``ClusterSpec.of``); ``dtwork.start(...)`` and ``Cluster(...)`` take the same names as keywords.
What can be checked without the host (a profile beside a launcher) is checked here; the rest
(GPUs, interfaces, the launcher's environment) when the engine group is made.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field

from dtwork.config import ExperimentConfig
from dtwork.errors import DtworkError
from dtwork.launch import launchers, registry

DEFAULT_TIMEOUT = 300.0  # process-group timeout (s): bounded, unlike NCCL's 30 minutes
ENGINE_TIMEOUT = 60  # seconds to wait for engines to register

# An experiment config as users hand it: loaded, a mapping, YAML text or a file.
ConfigSource = ExperimentConfig | Mapping[str, object] | str | os.PathLike[str] | None
StoreSource = str | os.PathLike[str] | None
T = typing.TypeVar("T")


def _flag(default: T, flag: str, kind: type) -> T:
    """A field that ``%dtrain start`` sets with ``flag``, a ``kind`` value."""
    return field(default=default, metadata={"flag": flag, "type": kind})


@dataclass(frozen=True)
class ClusterSpec:
    """A start request: how many ranks, where, with what (validated by the engine group)."""

    n: int | None = _flag(None, "-n", int)
    backend: str = _flag("auto", "--backend", str)
    timeout: float = _flag(DEFAULT_TIMEOUT, "--timeout", float)
    interface: str | None = _flag(None, "--interface", str)
    profile: str | None = _flag(None, "--profile", str)
    global_batch_size: int | None = _flag(None, "--global-batch-size", int)
    config: ConfigSource = _flag(None, "--config", str)
    store: StoreSource = _flag(None, "--store", str)
    launcher: str | None = _flag(None, "--launcher", str)
    engine_timeout: int = _flag(ENGINE_TIMEOUT, "--engine-timeout", int)
    # How long the cluster outlives its kernel, for a notebook to %dtrain attach (seconds, or "2h").
    keep: float | str | None = _flag(None, "--keep", str)
    launch_options: launchers.LaunchOptions | None = None  # its fields are flags of their own

    def __post_init__(self) -> None:
        if self.profile and self.launcher not in (None, "local"):
            raise DtworkError("use --launcher or --profile, not both (a profile names its own launcher)")
        if self.keep is not None:  # "2h" -> 7200.0, checked before anything starts
            object.__setattr__(self, "keep", registry.parse_duration(self.keep))

    @classmethod
    def of(cls, n: int | None = None, **options: object) -> ClusterSpec:
        """The spec of ``Cluster``'s and ``dtwork.start``'s keywords: its fields, and the launcher's
        options (``partition``, ``time``, ``account``, ``gpus_per_node``, ``nodes``, ``hosts``)."""
        # The keywords are the user's: their types are checked where they are used (validate_request).
        given: dict[str, typing.Any] = dict(options)
        launch = {k: given.pop(k) for k in launchers.OPTION_NAMES if k in given}
        known = {f.name for f in dataclasses.fields(cls)}
        for name in given:
            if name not in known:
                raise TypeError(f"unexpected keyword argument {name!r}")
        if launch:
            given["launch_options"] = launchers.LaunchOptions(**launch)
        return cls(**{"n": n, **given})

    @property
    def keep_seconds(self) -> float | None:
        """The keep time in seconds (None: the cluster ends with its kernel)."""
        return float(self.keep) if self.keep is not None else None

    def launcher_plugin(self) -> launchers.Launcher:
        """The launcher this spec names, with its options (a DtworkError for an unknown name)."""
        return launchers.get(self.launcher, self.launch_options)


def _value_type(hint: object) -> type:
    """The type of an optional field's value: ``int`` of ``int | None``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    kind = args[0] if isinstance(hint, types.UnionType) and args else hint
    return kind if isinstance(kind, type) else str


def start_flags() -> list[tuple[str, str, type]]:
    """``%dtrain start``'s options as (flag, name, type): the spec's, then the launcher's."""
    out = [
        (f.metadata["flag"], f.name, f.metadata["type"])
        for f in dataclasses.fields(ClusterSpec)
        if "flag" in f.metadata
    ]
    hints = typing.get_type_hints(launchers.LaunchOptions)
    for name in launchers.OPTION_NAMES:
        out.append(("--" + name.replace("_", "-"), name, _value_type(hints[name])))
    return out
