"""JSON and YAML documents parsed within a budget of nodes, for files that anyone on the node may write.

Every scalar, sequence and mapping of a document is one node. A YAML alias counts as many nodes as the
value it names holds, its own aliases expanded, so the budget bounds both what the document holds and what
any walk over it visits: a kilobyte of nested aliases that would expand to a billion nodes is refused at the
alias that crosses the budget, not walked.

A YAML document is built from the parser's events (libyaml's, when PyYAML has it: ~1 µs an event) into plain
dicts, lists and scalars; PyYAML's node graph, which costs ~100 bytes of memory per byte of file, is never
built. A JSON document's nodes are counted from its punctuation before it is parsed (an upper bound: a comma
inside a string counts too), then the standard library parses it.
"""

from __future__ import annotations

import json
from typing import Any

from otel_numa.sources.errors import SourceCorrupt

PARSE_ERROR = "parse_error"
OVER_LIMIT = "over_limit"
MAX_DEPTH = 64  # far deeper than any configuration file nests

_NO_KEY = object()
_MERGE = object()  # the YAML merge key ``<<``
_MAP_TAGS = (None, "!", "tag:yaml.org,2002:map")
_SEQ_TAGS = (None, "!", "tag:yaml.org,2002:seq")
_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def starts_as_json(data: bytes) -> bool:
    """Whether the text begins as a JSON object does (a YAML file may too: JSON is tried first)."""
    return data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"{"


def json_nodes_at_most(data: bytes) -> int:
    """An upper bound of the nodes of the JSON text ``data``: each value after a comma or colon, each
    container, and the first value."""
    return sum(data.count(mark) for mark in (b",", b":", b"[", b"{")) + 1


def load_json(data: bytes, max_nodes: int, what: str) -> Any:
    """The JSON document; SourceCorrupt ``over_limit`` past ``max_nodes``, ``parse_error`` if not JSON."""
    if json_nodes_at_most(data) > max_nodes:
        raise SourceCorrupt(f"{what}: more than {max_nodes} JSON values", error_type=OVER_LIMIT)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # json.JSONDecodeError is a ValueError
        raise SourceCorrupt(f"{what}: not JSON: {_first_line(exc)}", error_type=PARSE_ERROR) from exc


def load_yaml(data: bytes, max_nodes: int, what: str) -> Any:
    """The one YAML document of ``data`` as plain values (aliases share their value); SourceCorrupt
    ``over_limit`` once it holds more than ``max_nodes`` nodes with aliases expanded, or nests deeper than
    :data:`MAX_DEPTH`; ``parse_error`` if it is not YAML, holds several documents, or uses a tag or a key
    that plain values cannot hold."""
    import yaml  # only nodes with YAML files pay for the YAML parser

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(data)
    try:
        return _Builder(yaml, max_nodes, what).build(loader)
    except yaml.YAMLError as exc:
        raise SourceCorrupt(f"{what}: not YAML: {_first_line(exc)}", error_type=PARSE_ERROR) from exc
    except (ValueError, TypeError, OverflowError) as exc:  # a scalar its tag cannot hold
        raise SourceCorrupt(f"{what}: not YAML: {_first_line(exc)}", error_type=PARSE_ERROR) from exc
    finally:
        loader.dispose()


def _first_line(exc: BaseException) -> str:
    """The parser's message without the lines that quote the file (a link may lead anywhere)."""
    problem = getattr(exc, "problem", None)  # a YAML error's own words, without the quoted snippet
    if problem:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{problem}{where}"
    return str(exc).split("\n", 1)[0]


class _Frame:
    """A sequence or mapping being built, and how many nodes it holds so far (itself included)."""

    __slots__ = ("anchor", "key", "merges", "nodes", "value")

    def __init__(self, value: list[Any] | dict[Any, Any], anchor: str | None) -> None:
        self.value = value
        self.anchor = anchor
        self.nodes = 1
        self.key: Any = _NO_KEY
        self.merges: list[dict[Any, Any]] = []


class _Builder:
    def __init__(self, yaml: Any, max_nodes: int, what: str) -> None:
        self._yaml = yaml
        self._max_nodes = max_nodes
        self._what = what
        self._nodes = 0
        self._anchors: dict[str, tuple[Any, int]] = {}  # anchor -> (value, nodes it holds, expanded)
        self._stack: list[_Frame] = []
        self._documents = 0
        self._document: Any = None
        self._resolver = yaml.resolver.Resolver()
        self._constructor = yaml.constructor.SafeConstructor()

    def build(self, loader: Any) -> Any:
        events = self._yaml.events
        while True:
            event = loader.get_event()
            kind = type(event)
            if kind is events.ScalarEvent:
                self._count(1)
                self._add(self._scalar(event), 1, event.anchor)
            elif kind is events.AliasEvent:
                anchored = self._anchors.get(event.anchor)
                if anchored is None:
                    raise SourceCorrupt(f"{self._what}: an alias to no anchor", error_type=PARSE_ERROR)
                self._count(anchored[1])
                self._add(anchored[0], anchored[1], None)
            elif kind is events.MappingStartEvent or kind is events.SequenceStartEvent:
                mapping = kind is events.MappingStartEvent
                if event.tag not in (_MAP_TAGS if mapping else _SEQ_TAGS):
                    raise SourceCorrupt(f"{self._what}: an unsupported YAML tag", error_type=PARSE_ERROR)
                if len(self._stack) >= MAX_DEPTH:
                    raise SourceCorrupt(
                        f"{self._what}: nested deeper than {MAX_DEPTH} levels", error_type=OVER_LIMIT
                    )
                self._count(1)
                self._stack.append(_Frame({} if mapping else [], event.anchor))
            elif kind is events.MappingEndEvent or kind is events.SequenceEndEvent:
                frame = self._stack.pop()
                if frame.merges:
                    merged: dict[Any, Any] = {}
                    # an earlier merged mapping wins over a later one, the mapping's own keys over both
                    for source in reversed(frame.merges):
                        merged.update(source)
                    merged.update(frame.value)
                    frame.value = merged
                self._add(frame.value, frame.nodes, frame.anchor)
            elif kind is events.DocumentStartEvent:
                self._documents += 1
                if self._documents > 1:
                    raise SourceCorrupt(f"{self._what}: more than one YAML document", error_type=PARSE_ERROR)
            elif kind is events.StreamEndEvent:
                return self._document

    def _count(self, nodes: int) -> None:
        self._nodes += nodes
        if self._nodes > self._max_nodes:
            raise SourceCorrupt(
                f"{self._what}: more than {self._max_nodes} YAML nodes (aliases expanded)",
                error_type=OVER_LIMIT,
            )

    def _scalar(self, event: Any) -> Any:
        tag = event.tag
        if tag is None or tag == "!":
            if not event.implicit[0]:
                return event.value  # quoted: a string
            tag = self._resolver.resolve(self._yaml.ScalarNode, event.value, event.implicit)
        if tag == _STR_TAG:
            return event.value
        if tag == _MERGE_TAG:
            return _MERGE
        construct = self._constructor.yaml_constructors.get(tag)
        if construct is None or tag.endswith((":map", ":seq", ":omap", ":pairs", ":set")):
            raise SourceCorrupt(f"{self._what}: an unsupported YAML tag", error_type=PARSE_ERROR)
        return construct(self._constructor, self._yaml.ScalarNode(tag, event.value))

    def _add(self, value: Any, nodes: int, anchor: str | None) -> None:
        if anchor is not None:
            self._anchors[anchor] = (value, nodes)
        if not self._stack:
            self._document = value
            return
        frame = self._stack[-1]
        frame.nodes += nodes
        if isinstance(frame.value, list):
            frame.value.append(value)
        elif frame.key is _NO_KEY:
            if isinstance(value, (dict, list)):
                raise SourceCorrupt(f"{self._what}: a key that is not a scalar", error_type=PARSE_ERROR)
            frame.key = value
        elif frame.key is _MERGE:
            sources = value if isinstance(value, list) else [value]
            if not all(isinstance(source, dict) for source in sources):
                raise SourceCorrupt(f"{self._what}: a merge key of no mapping", error_type=PARSE_ERROR)
            frame.merges.extend(sources)
            frame.key = _NO_KEY
        else:
            frame.value[frame.key] = value
            frame.key = _NO_KEY
