"""Property-based fuzzing past argument parsing, against the real code paths.

- configs: random mappings and YAML text through ``load_config``: a valid config (that reads back
  equal from its own YAML) or a one-line DtworkError, never another exception;
- ``ctx.log`` names and values through the rank's real path (``ctx.log`` -> records -> the
  kernel's ``StoreWriter`` -> SQLite): stored, or refused at ``ctx.log`` with a one-line
  DtworkError; the writer never raises and drops nothing it accepted;
- the server's route parameters (odd run ids, metric names, query parameters) against a real
  jupyter_server: 200, or a 4xx with a JSON message, never a 500.

Every test is derandomized so that CI runs the same examples each time.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import torch
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from jupyter_server_fixtures import server_fixtures
from tornado.httpclient import HTTPClientError

from dtwork.config import ExperimentConfig, describe_fields, load_config
from dtwork.errors import DtworkError
from dtwork.runtime.context import Context
from dtwork.runtime.core import publish
from dtwork.store.runs import RunStore
from dtwork.store.writer import StoreWriter

globals().update(server_fixtures(autouse=False))

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text.strip(), f"{type(exc).__name__} without a message"
    assert "\n" not in text and "\r" not in text, f"message is not one line: {text!r}"
    return text


# -- configs ---------------------------------------------------------------------------------

# Every real field path and its type (from the schema itself), Determined's own fields, and junk.
FIELDS = dict(line.split(": ", 1) for line in describe_fields())
PATHS = list(FIELDS)


def _plausible(type_text: str) -> st.SearchStrategy[Any]:
    """Values of a field's own type (from ``describe_fields``), so that a share of the configs is valid."""
    kind = type_text.split(" = ")[0]
    if kind.startswith("{"):
        return st.dictionaries(
            st.sampled_from(["batches", "records", "epochs"]), st.integers(1, 64), max_size=1
        )
    if kind.startswith("int"):
        return st.integers(min_value=1 if ">= 1" in kind else 0, max_value=64)
    if kind.startswith("float"):
        return st.floats(min_value=0.0, max_value=1.0)
    if kind.startswith("tuple"):
        return st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=2, max_size=2)
    if kind == "bool":
        return st.booleans()
    if "|" in kind and " " not in kind:
        return st.sampled_from(kind.split("|"))
    return st.text(max_size=8)


KEYS = st.one_of(
    st.sampled_from(sorted({p.split(".")[0] for p in PATHS})),
    st.sampled_from(
        ["hyperparameters", "searcher", "entrypoint", "bind_mounts", "environment", "max_length"]
    ),
    st.sampled_from(["global_batch_size", "slots_per_trial", "batches", "epochs", "records", "type", "base"]),
    st.text(max_size=8),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.sampled_from([0, 1, 2, 8, -1, 2**32, 2**63, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        ["", "none", "sgd", "adam", "cosine", "fp16", "linear", "1e-3", "two", "yes", "ünï", "\x00"]
    ),
    st.text(max_size=10),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=12,
)


def _leaf_config() -> st.SearchStrategy[dict[str, Any]]:
    """A mapping that sets a few real dotted fields (so that many examples get past the top level)."""

    def build(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for path, value in items:
            node = out
            *parents, last = path.split(".")
            for p in parents:
                child = node.setdefault(p, {})
                if not isinstance(child, dict):
                    break
                node = child
            else:
                node[last] = value
        return out

    def value(path: str) -> st.SearchStrategy[Any]:  # one field in ten gets any value at all
        return st.integers(0, 9).flatmap(lambda k: SCALARS if k == 0 else _plausible(FIELDS[path]))

    field = st.sampled_from(PATHS).flatmap(lambda p: st.tuples(st.just(p), value(p)))
    return st.lists(field, max_size=5).map(build)


CONFIGS = st.one_of(_leaf_config(), st.dictionaries(KEYS, VALUES, max_size=6), VALUES)


def _loads_or_refuses(source: Any) -> None:
    try:
        cfg = load_config(source)
    except DtworkError as exc:
        _one_line(exc)
        event("refused")
        return
    event("valid")
    assert isinstance(cfg, ExperimentConfig)
    assert load_config(cfg.to_yaml()) == cfg, "a valid config does not read back from its own YAML"


@FUZZ
@given(config=CONFIGS)
def test_config_mappings_load_or_refuse(config: Any) -> None:
    if not isinstance(config, dict):  # a mapping is the only non-text, non-None source
        config = {"hyperparameters": config} if config is not None else None
    _loads_or_refuses(config)


def _yaml_text(data: Any) -> str:
    try:
        return yaml.safe_dump(data, allow_unicode=True)
    except (yaml.YAMLError, ValueError):
        return "{}"


YAML_TEXTS = st.one_of(
    CONFIGS.map(_yaml_text),
    st.tuples(CONFIGS.map(_yaml_text), st.integers(0, 200), st.text(max_size=6)).map(
        lambda t: t[0][: t[1]] + t[2] + t[0][t[1] :]  # the same text with junk spliced in
    ),
    st.sampled_from(
        [
            "a: &x [1]\nb: *x\n",
            "a: &a [1,2]\nb: &b [*a,*a]\nc: &c [*b,*b]\nd: &d [*c,*c]\n",
            "lr: {base: .inf}\n",
            "global_batch_size: 0x10\n",
            "global_batch_size: 1_000\n",
            "resources: !!python/object:os.system {}\n",
            "? [1, 2]\n: 3\n",
            "a: 1\na: 2\n",
            "%YAML 1.1\n---\nx: 1\n",
            "--- 1\n--- 2\n",
            "\t- x",
            "\ufeffname: x\n",
            "name: \udcff\n",
        ]
    ),
    st.text(max_size=40).filter(lambda t: "\n" in t or not t.strip().lower().endswith((".yaml", ".yml"))),
)


@FUZZ
@given(text=YAML_TEXTS)
def test_config_yaml_text_loads_or_refuses(text: str) -> None:
    _loads_or_refuses(text)


# -- ctx.log names and values -> records -> writer -> store ---------------------------------

NAMES = st.one_of(
    st.sampled_from(
        [
            "loss",
            "",
            " ",
            "a.b",
            "a/b",
            "ünï",
            "名前",
            "🙂",
            "\x00",
            "a\nb",
            "<img src=x onerror=1>",
            "x" * 500,
        ]
    ),
    st.sampled_from(["'; DROP TABLE metrics; --", "\udcff", "step_", "__class__", "kind", "value"]),
    st.text(max_size=12),
)
LOG_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([10**400, -(10**400), True, 0, 1e308, -1e-320, 2**63]),
    st.sampled_from(["1.5", "nan", "abc", "", None, [1.0], (2.0,), {"a": 1}, 1j, b"1", object()]),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda f: torch.tensor(f, dtype=torch.float64)),
    st.sampled_from([torch.tensor([3.0]), torch.tensor([1.0, 2.0]), torch.tensor(7), torch.zeros(0)]),
)


@pytest.fixture(scope="module")
def published() -> Iterator[list[dict[str, Any]]]:
    """What a rank publishes (ipyparallel's datapub is the transport; outside an engine it is a
    no-op, so the batches are taken here instead)."""
    out: list[dict[str, Any]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(publish, "_publish", out.append)
        yield out


@pytest.fixture(scope="module")
def log_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunStore, Path]]:
    path = tmp_path_factory.mktemp("fuzz-log") / "runs.sqlite"
    with RunStore(path) as store:
        yield store, path


def _ctx() -> Context:
    return Context(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")


def _records(published: list[dict[str, Any]]) -> list[Any]:
    batches = [recs for data in published for key, recs in data.items() if key.startswith("r")]
    published.clear()
    return [r for recs in batches for r in recs]


def _expected(value: Any) -> float:
    """What the store gives back: the value as logged, NaN and infinities included."""
    return float(value.item() if isinstance(value, torch.Tensor) else value)


@FUZZ
@given(logged=st.dictionaries(NAMES, LOG_VALUES, min_size=1, max_size=4), in_loop=st.booleans())
def test_ctx_log_is_stored_or_refused(
    published: list[dict[str, Any]],
    log_store: tuple[RunStore, Path],
    logged: dict[str, Any],
    in_loop: bool,
) -> None:
    store, path = log_store
    rid = store.create_run(name="fuzz", world_size=1, backend="gloo")  # one run per example
    said: list[str] = []
    writer = StoreWriter(lambda: store, path, said.append)
    logged.pop("step", None)  # ctx.log's own keyword
    ctx = _ctx()
    try:
        if in_loop:
            for _ in ctx.steps([0], max_steps=1):
                ctx.log(**logged)
        else:
            ctx.log(**logged)
    except DtworkError as exc:
        assert "ctx.log" in _one_line(exc)
        event("refused")
        _records(published)
        return
    records = [r for r in _records(published) if r.get("kind") == "log"]
    writer.records(rid, 1, records)
    assert writer.flush(force=True), f"the writer kept {writer.unsaved} records: {said}"
    assert not said, said
    rows = store.metrics(rid, rank="all")
    assert {r["name"]: r["value"] for r in rows} == pytest.approx(
        {name: _expected(v) for name, v in logged.items()}, nan_ok=True
    )


# -- server routes ---------------------------------------------------------------------------

ODD = st.one_of(
    st.sampled_from(
        ["1", "2", "0", "-1", "1.0", "01", "1e3", "0x1", "9" * 40, "..", ".", "%", "١", "１", "nan"]
    ),
    st.sampled_from(["1;DROP", "' OR 1=1 --", "a b", "\x00", "\udcff", "🙂", "latest", "x" * 300]),
    st.sampled_from(["loss", "ünï", "a/b", "<b>", "名前", "x" * 300]),  # the served run's metric names
    st.integers(min_value=-(10**25), max_value=10**25).map(str),
    st.text(max_size=12),
)
QUERY = st.dictionaries(
    st.one_of(st.sampled_from(["name", "max_points", "limit", "run", "step"]), st.text(max_size=6)),
    ODD,
    max_size=3,
)
ROUTES = st.one_of(
    st.tuples(st.just("GET"), ODD.map(lambda i: ("runs", i))),
    st.tuples(st.just("GET"), ODD.map(lambda i: ("runs", i, "metrics"))),
    st.tuples(st.just("GET"), st.just(("runs", "1", "metrics"))),
    st.tuples(st.just("GET"), st.just(("runs",))),
    st.tuples(st.just("POST"), ODD.map(lambda i: ("clusters", i, "stop"))),
    st.tuples(st.just("POST"), ODD.map(lambda i: ("runs", i, "report"))),
    st.tuples(st.just("GET"), st.lists(ODD, min_size=1, max_size=3).map(tuple)),
)
BODIES = st.one_of(
    st.sampled_from(["", "{}", "[]", "null", '{"environ": 1}', '{"environ": {"A": 1}}', "{", "\xff"]),
    st.text(max_size=20),
)


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"dtwork": True}}}


@pytest.fixture
def served_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real store with one run whose metrics have odd names (set before the server starts)."""
    monkeypatch.setenv("DTWORK_HOME", str(tmp_path / "home"))
    path = tmp_path / "runs.sqlite"
    monkeypatch.setenv("DTWORK_STORE", str(path))
    with RunStore(path) as s:
        rid = s.create_run(name="odd", world_size=2, backend="gloo")
        names = ["loss", "ünï", "a b", "a/b", "<b>", "名前", "x" * 300]
        s.add_metrics(rid, [{"step": i, "name": n, "value": 1.0 / (i + 1)} for i in range(5) for n in names])
        s.add_metrics(rid, [{"step": 5, "name": "loss", "value": math.nan}])
    return path


def _url_parts(parts: tuple[str, ...]) -> list[str]:
    return [quote(p.encode("utf-8", "surrogatepass"), safe="") for p in parts]


@pytest.mark.usefixtures("jp_asyncio_loop", "jp_server_cleanup")
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(route=ROUTES, query=QUERY, body=BODIES)
def test_routes_answer_or_refuse_never_500(
    served_store: Path, jp_fetch: Any, route: tuple[str, tuple[str, ...]], query: dict[str, str], body: str
) -> None:
    method, parts = route
    if parts[:1] == ("clusters",) or parts[-1:] == ("report",):
        query = {}  # these take no query; a report of a real run would write files: ids only
        if parts[-1:] == ("report",) and parts[1:2] == ("1",):
            return
    params = {k.encode("utf-8", "surrogatepass").decode("utf-8", "replace"): v for k, v in query.items()}
    params = {k: v.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for k, v in params.items()}
    kwargs: dict[str, Any] = {"method": method, "params": params}
    if method == "POST":
        kwargs["body"] = body.encode("utf-8", "surrogatepass")
    code, text = asyncio.get_event_loop().run_until_complete(_fetch(jp_fetch, _url_parts(parts), kwargs))
    assert code == 200 or 400 <= code < 500, f"{method} {parts} {params}: {code} {text[:300]}"
    event(f"HTTP {code}")
    answer = json.loads(text)
    if code != 200:
        assert isinstance(answer.get("error"), str) and answer["error"], answer


async def _fetch(jp_fetch: Any, parts: list[str], kwargs: dict[str, Any]) -> tuple[int, str]:
    try:
        response = await jp_fetch("dtwork", *parts, **kwargs)
    except HTTPClientError as exc:
        assert exc.response is not None, exc
        return exc.code, exc.response.body.decode("utf-8", "replace")
    return response.code, response.body.decode("utf-8", "replace")


if sys.platform == "win32":  # pragma: no cover - the server fixtures need a POSIX event loop
    pytest.skip("POSIX only", allow_module_level=True)
