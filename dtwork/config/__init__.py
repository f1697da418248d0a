"""Experiment configs in Determined AI's vocabulary: load, validate, edit and dump them.

``load_config`` takes YAML text, a YAML file path, a mapping, an ``ExperimentConfig`` or ``None`` and
returns a frozen ``ExperimentConfig``. Every problem raises a one-line ``ConfigError`` that starts with
the source label ("config", or the file name) and the dotted field path, e.g.
``exp.yaml: optimizations.aggregation_frequency: expected an integer >= 1, got 'two'``.

Determined experiment files load as written (``dtwork.config.determined``): the global batch may sit in
``hyperparameters``, ``searcher.max_length`` is the default length of ``ctx.steps``, and fields dtwork
does not use are listed in ``ExperimentConfig.notes`` instead of refused.

YAML is read with YAML 1.2 scalars: only ``true``/``false`` are booleans (``yes``/``on`` stay strings)
and ``1e-8`` is a float. Duplicate keys are an error, and so is a file that aliases expand past
``MAX_VALUES`` values or that is larger than ``MAX_BYTES``.
"""

from __future__ import annotations

from dtwork.config._rules import Length
from dtwork.config._yaml import MAX_BYTES, MAX_VALUES
from dtwork.config.schema import (
    AdaptiveBatchSize,
    CheckpointConfig,
    Compression,
    ExperimentConfig,
    GNSConfig,
    LRConfig,
    Optimizations,
    OptimizerConfig,
    Resources,
    ScheduleConfig,
    SearcherConfig,
    describe_fields,
    load_config,
)

__all__ = [
    "MAX_BYTES",
    "MAX_VALUES",
    "AdaptiveBatchSize",
    "CheckpointConfig",
    "Compression",
    "ExperimentConfig",
    "GNSConfig",
    "LRConfig",
    "Length",
    "OptimizerConfig",
    "Optimizations",
    "Resources",
    "ScheduleConfig",
    "SearcherConfig",
    "describe_fields",
    "load_config",
]
