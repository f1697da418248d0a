"""Tests for dtwork.config: loading, validation messages, shorthands, round trips and editing."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtwork.config import (
    MAX_BYTES,
    CheckpointConfig,
    Compression,
    ExperimentConfig,
    GNSConfig,
    Length,
    LRConfig,
    OptimizerConfig,
    ScheduleConfig,
    describe_fields,
    load_config,
)
from dtwork.errors import ConfigError
from dtwork.shared import batch

EXAMPLE_FILE = Path(__file__).resolve().parents[2] / "docs" / "example-experiment.yaml"
EXAMPLE_YAML = EXAMPLE_FILE.read_text(encoding="utf-8")


def message(source: Any) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(source)
    return str(info.value)


# --------------------------------------------------------------------------- defaults and sources


@pytest.mark.parametrize("source", [None, {}, "", "   \n", "# only a comment\n", "~"])
def test_empty_sources_give_defaults(source: Any) -> None:
    assert load_config(source) == ExperimentConfig()


def test_defaults() -> None:
    cfg = load_config(None)
    assert cfg.name is None and cfg.global_batch_size is None
    assert cfg.resources.slots_per_trial is None
    assert cfg.optimizations.aggregation_frequency == 1
    assert cfg.optimizations.gradient_compression == Compression("none", 1, 10)
    assert cfg.optimizations.tensor_fusion_threshold == 25.0
    assert cfg.optimizer == OptimizerConfig()
    assert cfg.optimizer.betas == (0.9, 0.999)
    assert cfg.lr == LRConfig(base=0.1, scaling="none", base_batch_size=None, warmup=0)
    assert cfg.lr_schedule.type == "constant"
    assert cfg.checkpoint == CheckpointConfig(every=None, keep=3, directory=".dtwork/checkpoints")
    assert cfg.gns == GNSConfig(enabled=False, ema_decay=0.999, every=1)
    assert cfg.mixed_precision == "none" and cfg.max_restarts == 0 and cfg.seed == 0
    assert cfg.hyperparameters == {}


def test_config_is_frozen() -> None:
    cfg = load_config({"seed": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 2  # type: ignore[misc]
    assert load_config(cfg) is cfg


def test_yaml_text_and_dict_agree() -> None:
    text = "global_batch_size: 64\noptimizations:\n  aggregation_frequency: 2\n"
    data = {"global_batch_size": 64, "optimizations": {"aggregation_frequency": 2}}
    assert load_config(text) == load_config(data)
    assert load_config(text).optimizations.aggregation_frequency == 2


def test_file_loading_str_and_pathlike(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("seed: 7\nlr: 0.5\n")
    assert load_config(path).seed == 7
    assert load_config(str(path)).lr.base == 0.5


def test_existing_file_without_yaml_suffix(tmp_path: Path) -> None:
    path = tmp_path / "experiment.conf"
    path.write_text("max_steps: 100\n")
    assert load_config(str(path)).max_steps == 100


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    path = tmp_path / "empty.yml"
    path.write_text("")
    assert load_config(path) == ExperimentConfig()


def test_yaml_12_scalars() -> None:
    cfg = load_config("optimizer:\n  type: adam\n  eps: 1e-6\nname: yes\nlr: 2e-3\n")
    assert cfg.optimizer.eps == 1e-6 and cfg.lr.base == 0.002
    assert cfg.name == "yes"
    assert load_config("gns: true").gns.enabled is True


def test_unsupported_source_type() -> None:
    assert message(42) == "config: expected a YAML file path, YAML text, a mapping or None, got 42"


# --------------------------------------------------------------------------- shorthand forms


def test_shorthands() -> None:
    cfg = load_config(
        {
            "optimizations": {"gradient_compression": "powersgd"},
            "optimizer": "adamw",
            "lr": 3,
            "lr_schedule": "step",
            "gns": True,
        }
    )
    assert cfg.optimizations.gradient_compression == Compression(type="powersgd")
    assert cfg.optimizer == OptimizerConfig(type="adamw")
    assert cfg.lr == LRConfig(base=3.0)
    assert cfg.lr_schedule == ScheduleConfig(type="step")
    assert cfg.gns == GNSConfig(enabled=True)


def test_mapping_forms() -> None:
    cfg = load_config(
        "optimizations:\n  gradient_compression: {type: powersgd, rank: 2, start_iter: 5}\n"
        "optimizer: {type: lars, trust_coefficient: 0.02}\n"
        "lr: {base: 0.4, scaling: sqrt, base_batch_size: 256, warmup: 10}\n"
        "global_batch_size: 1024\n"
        "gns: {enabled: true, ema_decay: 0.9, every: 1}\n"
    )
    assert cfg.optimizations.gradient_compression == Compression("powersgd", 2, 5)
    assert cfg.optimizer.trust_coefficient == 0.02
    assert cfg.effective_lr() == pytest.approx(0.8)
    assert (cfg.gns.ema_decay, cfg.gns.every) == (0.9, 1)


def test_enum_is_case_insensitive() -> None:
    assert load_config({"mixed_precision": "BF16"}).mixed_precision == "bf16"


def test_null_section_means_defaults() -> None:
    assert load_config("optimizations:\nhyperparameters:\n") == ExperimentConfig()


def test_float_field_accepts_int() -> None:
    value = load_config({"optimizations": {"tensor_fusion_threshold": 64}})
    assert value.optimizations.tensor_fusion_threshold == 64.0
    assert isinstance(value.optimizations.tensor_fusion_threshold, float)


# --------------------------------------------------------------------------- error messages


def test_bad_integer_in_file(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("optimizations:\n  aggregation_frequency: two\n")
    assert (
        message(path) == "exp.yaml: optimizations.aggregation_frequency: expected an integer >= 1, got 'two'"
    )


@pytest.mark.parametrize(
    ("value", "shown"), [(2.5, "2.5"), (2.0, "2.0"), (True, "True"), (0, "0"), (None, "None")]
)
def test_integers_must_be_integers(value: Any, shown: str) -> None:
    got = message({"optimizations": {"aggregation_frequency": value}})
    assert got == f"config: optimizations.aggregation_frequency: expected an integer >= 1, got {shown}"


def test_optional_integer_message() -> None:
    assert message({"max_steps": 0}) == "config: max_steps: expected an integer >= 1 or null, got 0"


def test_gns_every_message() -> None:
    assert message({"gns": {"every": 0}}) == "config: gns.every: expected an integer >= 1, got 0"


def test_bools_must_be_bools() -> None:
    got = message({"optimizations": {"average_training_metrics": "yes"}})
    assert got == "config: optimizations.average_training_metrics: expected true or false, got 'yes'"
    got = message("gns:\n  enabled: on\n")
    assert got == "config: gns.enabled: expected true or false, got 'on'"


def test_float_bounds() -> None:
    got = message({"optimizations": {"tensor_fusion_threshold": 0}})
    assert got == "config: optimizations.tensor_fusion_threshold: expected a number > 0, got 0"
    got = message({"gns": {"ema_decay": 1.0}})
    assert got == "config: gns.ema_decay: expected a number in (0, 1), got 1.0"
    got = message({"lr": {"base": float("inf")}})
    assert got == "config: lr.base: expected a number > 0, got inf"


def test_betas() -> None:
    assert load_config({"optimizer": {"betas": [0.8, 0.99]}}).optimizer.betas == (0.8, 0.99)
    got = message({"optimizer": {"betas": [0.9]}})
    assert got == "config: optimizer.betas: expected a list of two numbers in [0, 1), got list"


def test_unknown_key_did_you_mean(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("optimizations:\n  gradient_compresion: fp16\n")
    assert message(path) == (
        "exp.yaml: optimizations.gradient_compresion: unknown key; did you mean 'gradient_compression'?"
    )


def test_unknown_key_lists_valid_keys() -> None:
    assert message({"checkpoint": {"zzz": 1}}) == (
        "config: checkpoint.zzz: unknown key; valid keys: every, keep, directory"
    )
    assert message({"lr_scaling": "linear"}).startswith("config: lr_scaling: unknown key;")


def test_bad_enum() -> None:
    assert message({"mixed_precision": "fp32"}) == (
        "config: mixed_precision: expected one of none, fp16, bf16, got 'fp32'"
    )


def test_bad_enum_did_you_mean() -> None:
    assert message({"lr_schedule": {"type": "cosin", "total_steps": 5}}) == (
        "config: lr_schedule.type: expected one of constant, step, exponential, cosine, polynomial, "
        "got 'cosin'; did you mean 'cosine'?"
    )


def test_bad_shorthand() -> None:
    assert message({"optimizer": "adm"}) == (
        "config: optimizer: expected one of sgd, adam, adamw, lars or a mapping, got 'adm'; "
        "did you mean 'adam'?"
    )
    assert message({"lr": "fast"}) == "config: lr: expected a number > 0 or a mapping, got 'fast'"


def test_section_wrong_type() -> None:
    assert message({"optimizations": [1, 2]}) == "config: optimizations: expected a mapping, got list"
    assert message({"resources": 4}) == "config: resources: expected a mapping, got 4"


def test_global_batch_smaller_than_slots() -> None:
    assert message({"global_batch_size": 3, "resources": {"slots_per_trial": 4}}) == (
        "config: global_batch_size: 3 is smaller than resources.slots_per_trial=4; each slot needs at "
        "least one example: raise global_batch_size to >= 4"
    )


def test_cosine_needs_total_steps() -> None:
    assert message({"lr_schedule": "cosine"}) == (
        "config: lr_schedule.total_steps: cosine needs total_steps, max_steps or searcher.max_length"
    )
    cfg = load_config({"lr_schedule": "cosine", "max_steps": 100})
    assert cfg.lr_schedule.total_steps is None and cfg.schedule_total_steps() == 100


def test_lr_scaling_needs_global_batch_size() -> None:
    assert message({"lr": {"scaling": "linear", "base_batch_size": 256}}).startswith(
        "config: lr.scaling: linear scaling from lr.base_batch_size needs global_batch_size"
    )


def test_yaml_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("seed: 1\noptimizations:\n  x: [1, 2\n")
    got = message(path)
    assert got.startswith("exp.yaml: invalid YAML at line ")
    assert "\n" not in got
    assert message("a: b: c") == (
        "config: invalid YAML at line 1, column 5: mapping values are not allowed here"
    )


def test_duplicate_key() -> None:
    assert message("seed: 1\nmax_steps: 3\nseed: 2\n") == (
        "config: invalid YAML at line 3, column 1: duplicate key 'seed'"
    )


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    assert message(str(path)) == f"config file not found: {os.path.abspath(path)}"


def test_top_level_not_mapping(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_text("- 1\n- 2\n")
    assert message(path) == "exp.yaml: expected a mapping at the top level, got list"
    assert message("just text") == "config: expected a mapping at the top level, got 'just text'"


def test_hyperparameter_keys_must_be_strings() -> None:
    assert message({"hyperparameters": {1: 2}}) == "config: hyperparameters: keys must be strings, got 1"


# --------------------------------------------------------------------------- round trips and editing


def test_round_trip_example() -> None:
    cfg = load_config(EXAMPLE_YAML)
    assert load_config(cfg.to_dict()) == cfg
    assert load_config(cfg.to_yaml()) == cfg
    plain = cfg.to_dict()
    assert plain["optimizer"]["betas"] == [0.9, 0.999]
    assert isinstance(plain["optimizations"]["gradient_compression"], dict)


def test_round_trip_awkward_strings() -> None:
    cfg = load_config({"name": "1e5", "description": "yes", "hyperparameters": {"t": "true", "n": "null"}})
    assert load_config(cfg.to_yaml()) == cfg


def test_replace() -> None:
    cfg = load_config(None)
    new = cfg.replace(global_batch_size=64, optimizer="adam", lr=LRConfig(base=0.01))
    assert new.global_batch_size == 64 and new.optimizer.type == "adam" and new.lr.base == 0.01
    assert cfg.global_batch_size is None
    with pytest.raises(ConfigError, match="^config: seeed: unknown key; did you mean 'seed'\\?$"):
        cfg.replace(seeed=1)
    with pytest.raises(ConfigError, match="global_batch_size: 2 is smaller"):
        cfg.replace(global_batch_size=2, resources={"slots_per_trial": 8})


def test_with_path() -> None:
    cfg = load_config(None)
    assert (
        cfg.with_path("optimizations.tensor_fusion_threshold", 64.0).optimizations.tensor_fusion_threshold
        == 64
    )
    assert cfg.with_path("lr", 0.3).lr.base == 0.3
    assert cfg.with_path("hyperparameters.model.depth", 18).hyperparameters == {"model": {"depth": 18}}
    got = str(pytest.raises(ConfigError, cfg.with_path, "optimizations.tensor_fusion", 1).value)
    assert got == "config: optimizations.tensor_fusion: unknown key; did you mean 'tensor_fusion_threshold'?"
    got = str(pytest.raises(ConfigError, cfg.with_path, "seed.x", 1).value)
    assert got == "config: seed: not a section, so 'seed.x' cannot be set"
    with pytest.raises(ConfigError, match="expected a dotted field path"):
        cfg.with_path("lr..base", 1)
    with pytest.raises(ConfigError, match="^config: lr.base: expected a number > 0, got -1$"):
        cfg.with_path("lr.base", -1)


def test_the_batch_split_drops_the_remainder() -> None:
    assert batch.split(10, 3) == (3, 1) and batch.split(10, 5) == (2, 0) and batch.split(10, 10) == (1, 0)
    assert batch.per_slot(10, 3) == 3 and batch.effective(10, 3) == 9
    assert batch.per_slot(None, 4) is None and batch.effective(None, 4) is None
    with pytest.raises(ConfigError) as info:
        batch.split(10, 16)
    assert str(info.value) == (
        "global_batch_size 10 is smaller than the 16 slots: each slot needs at least one example; "
        "use a global batch of at least 16"
    )
    with pytest.raises(ConfigError, match="slots: expected an integer >= 1, got 0"):
        batch.per_slot(10, 0)


def test_effective_lr() -> None:
    cfg = load_config(
        {"global_batch_size": 1024, "lr": {"base": 0.1, "scaling": "linear", "base_batch_size": 256}}
    )
    assert cfg.effective_lr() == pytest.approx(0.4)
    assert cfg.with_path("lr.base_batch_size", None).effective_lr() == pytest.approx(0.1)


# --------------------------------------------------------------------------- example file and field list


def test_example_file_loads() -> None:
    cfg = load_config(EXAMPLE_FILE)
    assert cfg == load_config(EXAMPLE_YAML)
    assert cfg.optimizations.gradient_compression.type == "powersgd"
    assert cfg.effective_lr() == pytest.approx(0.2)


def test_example_shows_every_field() -> None:
    lines = describe_fields()
    assert "lr.base: float > 0 = 0.1" in lines
    for line in lines:
        leaf = line.split(":")[0].split(".")[-1]
        assert f"{leaf}:" in EXAMPLE_YAML, leaf


# --------------------------------------------------------------------------- properties

FIELD_PATHS = [line.split(":")[0] for line in describe_fields()]
KEYS = sorted({part for path in FIELD_PATHS for part in path.split(".")})
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["none", "fp16", "bf16", "powersgd", "sgd", "adam", "cosine", "linear", "yes"])
)
KEY = st.sampled_from(KEYS) | st.text(max_size=8) | st.integers(-3, 3) | st.none()
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEY, inner, max_size=5),
    max_leaves=20,
)
PROPERTY_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def accepts_or_config_error(source: Any) -> ExperimentConfig | None:
    try:
        return load_config(source)
    except ConfigError as exc:
        assert len(str(exc).splitlines()) == 1, str(exc)
        return None


@PROPERTY_SETTINGS
@given(st.dictionaries(KEY, VALUES, max_size=8))
def test_property_arbitrary_dicts(data: dict[Any, Any]) -> None:
    cfg = accepts_or_config_error(data)
    if cfg is not None:
        assert isinstance(cfg, ExperimentConfig)


@PROPERTY_SETTINGS
@given(VALUES)
def test_property_arbitrary_values(value: Any) -> None:
    accepts_or_config_error(value)


@PROPERTY_SETTINGS
@given(st.text())
def test_property_arbitrary_text(text: str) -> None:
    accepts_or_config_error(text)


YAML_LINE = st.tuples(
    st.sampled_from(["", "  ", "    ", "- "]),
    st.sampled_from([*KEYS, "x", "<<", "&a", "*a", "!!str"]),
    st.sampled_from([": ", ":", " "]),
    st.sampled_from(
        ["", "1", "-1", "2.5", "1e3", "true", "yes", "null", "[1, 2]", "{a: 1}", "'s'", "adam", "{"]
    ),
).map("".join)


@PROPERTY_SETTINGS
@given(st.lists(YAML_LINE, max_size=10).map("\n".join))
def test_property_yaml_like_text(text: str) -> None:
    accepts_or_config_error(text)


SAFE_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)


@PROPERTY_SETTINGS
@given(st.sampled_from(FIELD_PATHS), SAFE_VALUES)
def test_property_edits_round_trip(path: str, value: Any) -> None:
    base = load_config(EXAMPLE_YAML)
    try:
        cfg = base.with_path(path, value)
    except ConfigError as exc:
        assert len(str(exc).splitlines()) == 1
        assert str(exc).startswith("config: ")
        return
    assert load_config(cfg.to_dict()) == cfg
    assert load_config(cfg.to_yaml()) == cfg


# --------------------------------------------------------------------------- YAML limits


def _alias_bomb() -> str:
    """The billion-laughs pattern: nine levels of nine aliases each, 9**9 values once expanded."""
    lines = ["# x", "hyperparameters:", "  a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]"]
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"  {name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_fails_fast_with_one_line(tmp_path: Path) -> None:
    bomb = _alias_bomb()
    assert len(bomb.encode()) == 363
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb, encoding="utf-8")
    for source, label in ((bomb, "config"), (path, "bomb.yaml")):
        text = message(source)  # without the limit this ran for minutes and filled memory
        assert text == (
            f"{label}: the YAML expands to more than 100000 values through aliases (*name): "
            "write the values out instead of nesting aliases"
        )


def test_modest_aliases_still_load() -> None:
    cfg = load_config("hyperparameters:\n  base: &b {depth: 50, width: 2}\n  copy: *b\n")
    assert cfg.hyperparameters["copy"] == {"depth": 50, "width": 2}


def test_oversized_text_is_refused() -> None:
    text = "name: x\n" + "# " + "x" * (1 << 20) + "\n"
    assert (
        message(text) == f"config: {len(text)} bytes is more than a config may hold (1048576): split the file"
    )


@pytest.mark.parametrize("how", ["mapping", "aliases", "file"])
def test_a_config_over_the_limit_is_refused_where_it_comes_in(how: str, tmp_path: Path) -> None:
    blob = "x" * 20_000
    source: Any = {
        "mapping": {"name": "big", "hyperparameters": {"blob": "x" * MAX_BYTES}},
        "aliases": "hyperparameters:\n  a: &a " + blob + "\n  many: [" + ", ".join(["*a"] * 60) + "]\n",
        "file": tmp_path / "big.yaml",
    }[how]
    if how == "file":
        source.write_text("name: big\n# " + "x" * MAX_BYTES + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"more than a config may hold \({MAX_BYTES}\)"):
        load_config(source)


def test_a_config_just_under_the_limit_reads_back_from_its_yaml() -> None:
    """What configure takes, the report (which loads the stored YAML) takes too."""
    blob = "x" * (MAX_BYTES - 2000)
    cfg = load_config({"name": "big", "hyperparameters": {"blob": blob}})
    assert len(cfg.to_yaml().encode()) <= MAX_BYTES
    assert load_config(cfg.to_yaml()) == cfg


# --------------------------------------------------------------------------- Determined fields


def test_searcher_max_length_sets_the_default_stop() -> None:
    cfg = load_config(
        {"searcher": {"name": "single", "metric": "validation_loss", "max_length": {"batches": 117}}}
    )
    assert cfg.searcher.max_length == Length("batches", 117)
    assert cfg.searcher.metric == "validation_loss" and cfg.searcher.smaller_is_better is True
    assert cfg.stop(512) == (117, None)
    assert cfg.with_path("max_steps", 5).stop(512) == (5, None)  # dtwork's own field wins
    records = load_config({"global_batch_size": 100, "searcher": {"max_length": {"records": 1050}}})
    assert records.stop(100) == (11, None)
    epochs = load_config({"searcher": {"max_length": {"epochs": 3}}})
    assert epochs.stop(64) == (None, 3)
    counted = epochs.replace(records_per_epoch=640)
    assert counted.stop(64) == (30, None)


def test_searcher_refuses_searches_and_bad_lengths() -> None:
    assert message({"searcher": {"name": "pbt"}}) == (
        "config: searcher.name: 'pbt' is a hyperparameter search: dtwork runs grid, random and adaptive_asha "
        "searches (%%dtrain search) but not this one yet; or use name: single with constant hyperparameters"
    )
    assert message({"searcher": {"name": "adaptive_asha"}}).startswith(
        "config: searcher.name: 'adaptive_asha' is a hyperparameter search: run the file with %%dtrain search"
    )
    assert message({"searcher": {"name": "grid"}}) == (
        "config: searcher.name: 'grid' is a hyperparameter search: run the file with %%dtrain search "
        "(dtwork.search), each trial a run; or use name: single with constant hyperparameters"
    )
    assert message({"searcher": {"max_length": {"steps": 3}}}).startswith(
        "config: searcher.max_length: expected a length like {batches: 100}"
    )
    assert message({"searcher": {"max_length": {"records": 3}}}) == (
        "config: searcher.max_length: a length in records needs global_batch_size "
        "(or hyperparameters.global_batch_size)"
    )
    assert message({"min_validation_period": {"epochs": 1}}) == (
        "config: min_validation_period: a period in epochs needs records_per_epoch and global_batch_size"
    )


def test_hyperparameters_hold_the_global_batch_and_constants() -> None:
    cfg = load_config(
        {
            "hyperparameters": {
                "global_batch_size": 512,
                "lr": {"type": "const", "val": 0.5},
                "model": {"type": "resnet"},
            }
        }
    )
    assert cfg.global_batch_size == 512
    assert cfg.hyperparameters == {"global_batch_size": 512, "lr": 0.5, "model": {"type": "resnet"}}
    assert load_config(cfg.to_yaml()) == cfg
    assert message({"hyperparameters": {"lr": {"type": "double", "minval": 0.1, "maxval": 1.0}}}) == (
        "config: hyperparameters.lr: a searched hyperparameter (type: double) needs a search: run the file "
        "with %%dtrain search (searcher.name grid or random), or use a constant, e.g. lr: <value>"
    )
    assert message({"global_batch_size": 64, "hyperparameters": {"global_batch_size": 512}}) == (
        "config: global_batch_size: 64 differs from hyperparameters.global_batch_size 512: keep one of them"
    )


def test_periods_checkpoint_storage_and_data() -> None:
    cfg = load_config(
        {
            "global_batch_size": 100,
            "records_per_epoch": 1000,
            "min_validation_period": {"epochs": 1},
            "min_checkpoint_period": {"records": 450},
            "checkpoint_storage": {"type": "shared_fs", "host_path": "/mnt/ckpt", "storage_path": "mnist"},
            "data": {"url": "https://example.com/mnist.tar.gz"},
        }
    )
    assert cfg.steps_in(cfg.min_validation_period, 100) == 10
    assert cfg.steps_in(cfg.min_checkpoint_period, 100) == 5
    assert cfg.checkpoint.directory == "/mnt/ckpt/mnist"
    assert cfg.data == {"url": "https://example.com/mnist.tar.gz"}
    directory = load_config({"checkpoint_storage": {"type": "directory", "container_path": "/ckpt"}})
    assert directory.checkpoint.directory == "/ckpt"
    assert message({"checkpoint_storage": {"type": "s3", "bucket": "b"}}) == (
        "config: checkpoint_storage.type: 's3' is not supported yet: use shared_fs (host_path) or directory "
        "(container_path)"
    )


def test_ignored_fields_are_noted_in_one_line() -> None:
    cfg = load_config(
        "entrypoint: model_def:MNistTrial\nresources: {slots_per_trial: 2, resource_pool: gpu}\n"
        "checkpoint_storage: {type: shared_fs, host_path: /tmp, save_trial_best: 1}\n"
    )
    assert cfg.notes == (
        "config: dtwork ignores checkpoint_storage.save_trial_best, entrypoint, resources.resource_pool "
        "(it runs notebook cells on its own cluster)",
    )
    assert cfg == load_config(cfg.to_dict())  # notes are not part of the config's value
    assert "notes" not in cfg.to_dict()
    assert message({"entrypoint_x": 1}).startswith("config: entrypoint_x: unknown key")


def test_determined_boolean_compression() -> None:
    assert (
        load_config({"optimizations": {"gradient_compression": True}}).optimizations.gradient_compression.type
        == "fp16"
    )
    assert (
        load_config(
            {"optimizations": {"gradient_compression": False}}
        ).optimizations.gradient_compression.type
        == "none"
    )


def test_adaptive_batch_size() -> None:
    assert load_config(None).optimizations.adaptive_batch_size.max_global_batch_size is None
    cfg = load_config(EXAMPLE_FILE).optimizations.adaptive_batch_size
    assert (cfg.max_global_batch_size, cfg.min_per_slot_batch_size, cfg.decide_every) == (4096, 16, 100)
    short = load_config({"optimizations": {"adaptive_batch_size": 1024}}).optimizations.adaptive_batch_size
    assert (short.max_global_batch_size, short.decide_every) == (1024, 100)
    base = {"global_batch_size": 512, "resources": {"slots_per_trial": 4}}
    assert "smaller than global_batch_size=512" in message(
        {**base, "optimizations": {"adaptive_batch_size": 256}}
    )
    bad = {"max_global_batch_size": 512, "min_per_slot_batch_size": 256}
    assert "min_per_slot_batch_size x slots = 1024" in message(
        {**base, "optimizations": {"adaptive_batch_size": bad}}
    )
    assert "decide_every" in message({"optimizations": {"adaptive_batch_size": {"decide_every": 0}}})


@pytest.mark.parametrize("name", ["\x85", "a\u2028b", "\u2029", "名前 x"])
def test_names_with_yaml_line_breaks_round_trip(name: str) -> None:
    """NEL and the Unicode line and paragraph separators are YAML line breaks: a plain or single-quoted
    scalar folds them into a space (hypothesis found a hyperparameter named '\\x85' read back as ' ')."""
    cfg = load_config({"hyperparameters": {name: name}})
    assert load_config(cfg.to_yaml()) == cfg
