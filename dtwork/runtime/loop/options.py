"""The options of ``ctx.steps``: one dataclass per part they configure, the names checked against them.

``LoopOptions`` configures the loop (length, checkpoints, validation, replica checks, the run's
step axis); ``AdaptiveOptions`` only passes through to the adaptive batch. ``steps_options`` turns
the keywords of ``ctx.steps`` into both, refusing an unknown name with "did you mean" and a count
that is no int: the fields are the one list of names, their ``count`` metadata the one list of counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from dtwork.runtime.core import args

COUNT = {"count": True}  # a field's metadata: an int (or None), refused otherwise
Validate = Callable[[], Mapping[str, object] | None]
Resume = bool | int | str | Path  # True: this run's newest; a run (7, "run-7"); a file or run folder


@dataclass
class LoopOptions:
    """What ``ctx.steps`` is asked to do (None: the config's, where it has one)."""

    max_steps: int | None = field(default=None, metadata=COUNT)
    max_epochs: int | None = field(default=None, metadata=COUNT)
    resume: Resume = False
    checkpoint_every: int | None = field(default=None, metadata=COUNT)
    validate: Validate | None = None
    validate_every: int | None = field(default=None, metadata=COUNT)
    check_replicas_every: int | None = field(default=None, metadata=COUNT)
    new_run: bool | None = None


@dataclass
class AdaptiveOptions:
    """The adaptive batch's options of ``ctx.steps`` (and of ``ctx.loader(adaptive=True)`` but the flag)."""

    adaptive: bool = False
    max_global_batch: int | None = None
    min_per_slot_batch: int | None = None
    decide_every: int | None = None
    lr_rule: str | None = None


def names(cls: type[LoopOptions] | type[AdaptiveOptions]) -> list[str]:
    return [f.name for f in fields(cls)]


def steps_options(max_steps: int | None, given: dict[str, object]) -> tuple[LoopOptions, AdaptiveOptions]:
    """``ctx.steps``' keywords as the two options objects, checked (an error names the keyword)."""
    loop_names, adaptive_names = names(LoopOptions), names(AdaptiveOptions)
    args.check_keywords("ctx.steps", given, loop_names + adaptive_names)
    counts = {f.name for f in fields(LoopOptions) if f.metadata.get("count")}
    for name, value in (("max_steps", max_steps), *given.items()):
        if name in counts:
            args.check_count("ctx.steps", name, value)
    loop = LoopOptions(**{k: v for k, v in given.items() if k in loop_names})  # type: ignore[arg-type]
    loop.max_steps = max_steps
    adaptive = AdaptiveOptions(**{k: v for k, v in given.items() if k in adaptive_names})  # type: ignore[arg-type]
    return loop, adaptive
