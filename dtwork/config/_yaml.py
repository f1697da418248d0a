"""YAML in and out: YAML 1.2 scalars, no duplicate keys, and limits that stop alias bombs before they expand.

What YAML parses is of any shape until ``_rules`` checks it: ``Any`` here marks that boundary.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from dtwork.config._rules import error
from dtwork.errors import ConfigError

MAX_BYTES = 1 << 20  # a config file is a page of settings: a megabyte is far past any real one
MAX_VALUES = 100_000  # values after expanding aliases; a billion-laughs file has ~10**9

_BOOL_TAG = "tag:yaml.org,2002:bool"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_EXP_FLOAT_RE = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


class _TooLarge(Exception):
    pass


def expanded_size(root: yaml.Node, limit: int) -> int:
    """How many nodes ``root`` holds once every alias is written out, counted without expanding.

    An alias is the same node object as its anchor, so each node's expanded size is computed once
    and reused; the count stops with _TooLarge as soon as it passes ``limit``.
    """
    sizes: dict[int, int] = {}
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if children_done or not children:
            total = 1 + sum(sizes.get(id(c), 0) for c in children)
            if total > limit:
                raise _TooLarge
            sizes[id(node)] = total
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


class Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans and exponent floats that rejects duplicate keys."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                    if (key_node.tag, key_node.value) in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                        )
                    seen.add((key_node.tag, key_node.value))
        out: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return out


class Dumper(yaml.SafeDumper):
    """SafeDumper that quotes exactly the strings that ``Loader`` would not read back as strings."""


def _tune_resolvers(cls: type[yaml.SafeLoader] | type[yaml.SafeDumper], base: Any) -> None:
    cls.yaml_implicit_resolvers = {
        first: [(tag, regex) for tag, regex in entries if tag != _BOOL_TAG]
        for first, entries in base.yaml_implicit_resolvers.items()
    }
    cls.add_implicit_resolver(_BOOL_TAG, _BOOL_RE, list("tTfF"))
    cls.add_implicit_resolver(_FLOAT_TAG, _EXP_FLOAT_RE, list("-+0123456789."))


_tune_resolvers(Loader, yaml.SafeLoader)
_tune_resolvers(Dumper, yaml.SafeDumper)

_LINE_BREAKS = ("\x85", "\u2028", "\u2029")  # YAML line breaks that a plain or single-quoted scalar folds


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Double quotes escape these breaks (\N, \L, \P); any other style reads them back changed.
    style = '"' if any(c in value for c in _LINE_BREAKS) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


Dumper.add_representer(str, _represent_str)


def parse_yaml(text: str, label: str) -> Any:
    """YAML text -> Python data, or a one-line ConfigError (syntax, size, alias expansion)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise error(f"{label}: {size} bytes is more than a config may hold ({MAX_BYTES}): split the file")
    try:
        return _load(text, label)
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise error(f"{label}: invalid YAML{where}: {exc.problem or exc.context or 'syntax error'}") from None
    except yaml.YAMLError as exc:
        raise error(f"{label}: invalid YAML: {exc}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise error(f"{label}: invalid YAML value: {exc}") from None


def _load(text: str, label: str) -> Any:
    loader = Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            expanded_size(node, MAX_VALUES)
        except _TooLarge:
            raise error(
                f"{label}: the YAML expands to more than {MAX_VALUES} values through aliases (*name): "
                "write the values out instead of nesting aliases"
            ) from None
        return loader.construct_document(node)
    finally:
        loader.dispose()


def dump_yaml(data: object) -> str:
    text: str = yaml.dump(data, Dumper=Dumper, sort_keys=False, allow_unicode=True)
    return text
