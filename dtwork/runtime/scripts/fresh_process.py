"""A script's run as a fresh process would have it, and the rank's state put back when it ends.

A warm rank outlives the script it runs, so whatever a new ``torchrun`` process would start without
is taken away before the script and put back after it: the user's own modules (imported afresh
from the files as they are now), torch's process-wide settings, the ``atexit`` callbacks the run
registered (run when it ends) and libraries' process-wide singletons (Accelerate's states).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from dtwork.runtime.scripts.autoreload import INSTALLED, user_modules, within


@dataclass(frozen=True)
class _Setting:
    label: str
    get: Callable[[], Any]
    set: Callable[[Any], None]


def _attr(obj: object, name: str, label: str) -> _Setting:
    return _Setting(label, lambda: getattr(obj, name), lambda v: setattr(obj, name, v))


def _set_grad_enabled(on: bool) -> None:
    torch.set_grad_enabled(on)


def _set_default_device(device: torch.device) -> None:
    # None is torch's own default: a CPU device set explicitly would wrap every factory call in a mode.
    torch.set_default_device(None if device == torch.device("cpu") else device)


def _settings() -> list[_Setting]:
    """torch's process-wide settings that a script can change and a new process starts without."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    return [
        _Setting("default dtype", torch.get_default_dtype, torch.set_default_dtype),
        _Setting("default device", torch.get_default_device, _set_default_device),
        _Setting(
            "deterministic algorithms",
            lambda: (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            ),
            lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1]),
        ),
        _Setting(
            "float32 matmul precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision
        ),
        _Setting("grad mode", torch.is_grad_enabled, _set_grad_enabled),
        _Setting(
            "anomaly detection",
            lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
            lambda v: torch.set_anomaly_enabled(v[0], v[1]),
        ),
        _Setting("threads", torch.get_num_threads, torch.set_num_threads),
        _attr(cudnn, "enabled", "cudnn.enabled"),
        _attr(cudnn, "benchmark", "cudnn.benchmark"),
        _attr(cudnn, "deterministic", "cudnn.deterministic"),
        _attr(cudnn, "allow_tf32", "cudnn.allow_tf32"),
        _attr(matmul, "allow_tf32", "matmul.allow_tf32"),
        _attr(
            matmul, "allow_fp16_reduced_precision_reduction", "matmul.allow_fp16_reduced_precision_reduction"
        ),
        _attr(
            matmul, "allow_bf16_reduced_precision_reduction", "matmul.allow_bf16_reduced_precision_reduction"
        ),
    ]


@contextlib.contextmanager
def torch_settings(name: str, threads: int | None) -> Iterator[None]:
    """Start with ``threads`` threads (torchrun's OMP_NUM_THREADS); put every setting back after,
    with one line naming those the script changed."""
    settings = _settings()
    before = [s.get() for s in settings]
    if threads is not None:
        torch.set_num_threads(threads)
    start = [s.get() for s in settings]
    try:
        yield
    finally:
        changed = []
        for s, old, new in zip(settings, before, start, strict=True):
            now = s.get()
            if now != new:
                changed.append(f"{s.label} ({now[0] if isinstance(now, tuple) else now})")
            if now != old:
                s.set(old)
        if changed:
            print(f"dtwork: {name} changed torch's {', '.join(changed)}: put back for the next run")


@contextlib.contextmanager
def exit_callbacks() -> Iterator[None]:
    """Run the ``atexit`` callbacks registered during the block when it ends, last first.

    A library that registers one while it is first imported keeps it for the process's exit,
    since it stays imported; everything else (loggers, trackers, profilers) flushes now.
    """
    registered: list[tuple[Callable[..., object], tuple[object, ...], dict[str, object]]] = []
    real_register, real_unregister = atexit.register, atexit.unregister

    def register(fn: Callable[..., object], *args: object, **kwargs: object) -> Callable[..., object]:
        if _importing_a_library(sys._getframe(1)):
            return real_register(fn, *args, **kwargs)
        registered.append((fn, args, kwargs))
        return fn

    def unregister(fn: Callable[..., object]) -> None:
        registered[:] = [r for r in registered if r[0] != fn]
        real_unregister(fn)

    atexit.register, atexit.unregister = register, unregister  # type: ignore[assignment]
    try:
        yield
    finally:
        atexit.register, atexit.unregister = real_register, real_unregister  # type: ignore[assignment]
        for fn, args, kwargs in reversed(registered):
            try:
                fn(*args, **kwargs)
            except Exception:
                traceback.print_exc()  # as the interpreter does at exit, and go on


def _importing_a_library(frame: FrameType | None) -> bool:
    """Whether the innermost module body on the stack is an installed library's (its import)."""
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            file = frame.f_code.co_filename
            return not file.startswith("<") and within(str(Path(file).resolve()), INSTALLED)
        frame = frame.f_back
    return False


def reset_singletons() -> None:
    """Libraries' process-wide state as a new process has it (Accelerate refuses a second setup)."""
    state = sys.modules.get("accelerate.state")
    if state is not None:
        state.AcceleratorState._reset_state(reset_partial_state=True)
        state.GradientState._reset_state()


@contextlib.contextmanager
def fresh_modules(folders: Callable[[], tuple[str, ...]]) -> Iterator[None]:
    """The user's modules from ``folders()`` are imported afresh in the block, and dropped after it.

    Those imported before (by cells) are set aside and come back after, so the notebook keeps its own.
    """
    before = user_modules(folders())
    for name in before:
        del sys.modules[name]
    try:
        yield
    finally:
        for name in user_modules(folders()):
            sys.modules.pop(name, None)
        sys.modules.update(before)


@contextlib.contextmanager
def process_state() -> Iterator[None]:
    """The environment, warning filters and loggers as they were before the block.

    Libraries record settings there (Lightning's ``PL_GLOBAL_SEED``, ``logging.basicConfig``,
    transformers' verbosity).
    """
    env = dict(os.environ)
    loggers = [
        logging.getLogger(),
        *(x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)),
    ]
    saved = [(x, x.level, list(x.handlers), x.propagate, x.disabled) for x in loggers]
    try:
        with warnings.catch_warnings():
            yield
    finally:
        for key in [k for k in os.environ if k not in env]:
            del os.environ[key]
        for key, value in env.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        for logger, level, handlers, propagate, disabled in saved:
            logger.setLevel(level)
            logger.handlers[:], logger.propagate, logger.disabled = handlers, propagate, disabled


@contextlib.contextmanager
def launch(name: str, folders: Callable[[], tuple[str, ...]]) -> Iterator[None]:
    """Run the block as a new torchrun process would run a script called ``name``, then put back
    the rank as it was (its atexit callbacks first, as at a process's exit)."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    with (
        fresh_modules(folders),
        process_state(),
        torch_settings(name, int(threads) if threads.isdigit() else None),
    ):
        reset_singletons()
        try:
            with exit_callbacks():
                yield
        finally:
            reset_singletons()
