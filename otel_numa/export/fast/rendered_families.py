"""Patch ``rendered_families``: the page's unchanged families are rendered once.

prometheus_client renders every sample of every family on every scrape. The agent's page keeps each
family's last text; a family with the same series and values is served as it was, and one with the same
series and new values gets the new numbers written into its text (in prometheus_client's own number
format). A family of one line per series whose series came and went (a pod replaced) keeps the lines of
the series it still has and renders only the new series' lines. Anything else is rendered by
prometheus_client's public encoders, one family at a time, so the page is byte for byte what they write.
A long family's text is kept as a deflate segment, which a scrape that asks for gzip gets as it is, inside
one gzip member (:mod:`otel_numa.gzip_stream`); a plain scrape gets it decompressed. It requires
``reused_translations`` (it renders the families that patch keeps), relies on two unpromised shapes of
prometheus_client (its number format helper and the form of :func:`choose_encoder`'s answer), and serves
only the agent's own page app (:func:`page_app`); prometheus_client's module functions are left as they
are.
"""

from __future__ import annotations

import functools
import threading
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import prometheus_client.openmetrics.exposition as openmetrics
from prometheus_client import CollectorRegistry, generate_latest, make_wsgi_app
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.utils import floatToGoString

from otel_numa.export.fast.patch import Patch
from otel_numa.export.fast.reused_translations import (
    OneFamily,
    SeriesRecipe,
    ValuesFamily,
    _one_sample_per_point,
    _sample_lines,
    keys_of,
    plain_sample,
)
from otel_numa.gzip_stream import Segment, gzip_stream

_EOF = b"# EOF\n"
_NEWLINE, _COMMENT = ord("\n"), ord("#")
# zlib's fastest level for the text kept between scrapes: compressed when it changes, then sent as it is in
# a gzip page and decompressed for a plain one
KEPT_COMPRESSION_LEVEL = 1
# a shorter text is kept as it is: compressing one alone costs ~65 µs whatever its size (zlib sets up its
# window each time), the price of a family that changes every scrape (the agent's own process and
# source gauges), to save a few hundred bytes; a gzip page compresses such texts together
COMPRESSED_FROM_BYTES = 2048
# forms of the page whose last text is kept: a Prometheus server asks for the same one every time, and
# two scrapers that ask for different ones (the text format and OpenMetrics, say) must not make every
# scrape render every family afresh
KEPT_FORMS = 2


@dataclass
class _RenderedFamily:
    # the family's text, compressed when long (its label sets repeat from line to line: a twentieth of the
    # bytes): a gzip page takes it as it is, a plain one decompresses it, which costs a fraction of
    # rendering or compressing it
    kept: bytes | Segment
    # where each sample's value starts in ``text`` (it ends at the line's end); None when the family's
    # lines are not one plain "<series> <value>" line per sample
    value_starts: array[int] | None
    # what the text was rendered from: a recipe and values, or else the family itself (held)
    recipe: SeriesRecipe | None
    values: tuple[object, ...] | None
    family: Any

    @property
    def text(self) -> bytes:
        kept = self.kept
        return kept.text() if isinstance(kept, Segment) else kept


def _kept(data: bytes) -> bytes | Segment:
    """The form in which a family's text is kept between scrapes."""
    return data if len(data) < COMPRESSED_FROM_BYTES else Segment(data, KEPT_COMPRESSION_LEVEL)


# a page as kept texts in order: a gzip page takes them as they are (otel_numa.gzip_stream)
Page = list[bytes | Segment]


def plain(page: Page) -> bytes:
    """``page``'s text."""
    return b"".join([part.text() if isinstance(part, Segment) else part for part in page])


class RenderedFamilies:
    """prometheus_client's text and OpenMetrics encoders for the agent's page: reuses the last text (in
    the form asked for) of a family with the same series and values, writes only the new values into it
    for a family with the same series, and renders the rest through the library."""

    def __init__(self, text_encoder: Callable[..., bytes], openmetrics_encoder: Callable[..., bytes]) -> None:
        self.text_encoder = text_encoder
        self.openmetrics_encoder = openmetrics_encoder
        # by form, the last text of each family by name, for the KEPT_FORMS forms asked for last
        self._last: dict[tuple[object, ...], dict[str, _RenderedFamily]] = {}
        self._keeping = threading.Lock()

    def text(self, registry: Any, **options: str) -> Page:
        form = ("text", *sorted(options.items()))
        return self._render(registry, form, lambda one: self.text_encoder(one, **options))

    def openmetrics(self, registry: Any, **options: str) -> Page:
        def render(one: OneFamily) -> bytes:
            return self.openmetrics_encoder(one, **options).removesuffix(_EOF)

        page = self._render(registry, ("openmetrics", *sorted(options.items())), render)
        page.append(_EOF)
        return page

    def _render(self, registry: Any, form: tuple[object, ...], render: Callable[[OneFamily], bytes]) -> Page:
        last = self._last.get(form, {})
        now: dict[str, _RenderedFamily] = {}
        page: Page = []
        for family in registry.collect():
            known = last.get(family.name)
            rendered = _again(known, family) if known is not None else None
            if rendered is None and known is not None and isinstance(family, ValuesFamily):
                rendered = _with_new_series(known, family, render)
            if rendered is None:
                rendered = _rendered(family, render)
            now[family.name] = rendered
            page.append(rendered.kept)
        with self._keeping:  # two scrapes may end at once
            self._last.pop(form, None)  # then put last: the form asked for most recently
            self._last[form] = now
            if len(self._last) > KEPT_FORMS:
                del self._last[next(iter(self._last))]  # the form asked for least recently
        return page


def _again(known: _RenderedFamily, family: Any) -> _RenderedFamily | None:
    """``known``'s text for ``family``, with the new values written in; None when the series differ."""
    if isinstance(family, ValuesFamily):
        if family.recipe is not known.recipe:
            return None
        if family.values == known.values:
            return known
        return _with_new_values(known, family.values) if known.value_starts is not None else None
    if known.family is family:
        return known
    if known.value_starts is not None and known.family is not None and _same_series(known.family, family):
        return _with_new_values(known, tuple([sample.value for sample in family.samples]), family)
    return None


def _with_new_series(
    known: _RenderedFamily, family: ValuesFamily, render: Callable[[OneFamily], bytes]
) -> _RenderedFamily | None:
    """``family``'s text from ``known``'s, when both are one plain line per series of the same family: the
    lines of the series ``known`` has (found by their attribute mappings, the same objects while a series
    lives) with the new values, the new series' lines rendered through the library. None otherwise."""
    before, recipe, values = known.recipe, family.recipe, family.values
    known_values = known.values
    if before is None or known.value_starts is None or known_values is None or not before.same_family(recipe):
        return None
    where = {id(attributes): index for index, attributes in enumerate(before.attributes)}
    new = [index for index, attributes in enumerate(recipe.attributes) if id(attributes) not in where]
    new_lines: list[bytes] = []
    if new:
        attributes = [recipe.attributes[index] for index in new]
        some_values = [values[index] for index in new]
        # series kept only for their keys, so that the family rendered has all the keys of the whole
        for index, anchor in _anchors(recipe, attributes):
            attributes.append(anchor)
            some_values.append(values[index])
        made = recipe.family_of(tuple(attributes), tuple(some_values))
        if not _one_sample_per_point((("", made),), tuple(some_values)):
            return None
        lines = _sample_lines(render(OneFamily(made)))
        new_lines = lines.splitlines(keepends=True)[: len(new)]
        if len(new_lines) != len(new) or not lines.endswith(b"\n"):
            return None
    text, starts = known.text, known.value_starts
    header_end = _header_end(text)

    def line_start(line: int) -> int:
        """Where known sample line ``line`` starts (the text's end past the last): the one before ends
        after its value."""
        return text.index(b"\n", starts[line - 1]) + 1 if line else header_end

    parts: list[bytes] = [text[:header_end]]
    value_starts = array("i")
    written = header_end
    added = iter(new_lines)
    # each series' line in the known text, -1 for a new series
    olds = [where.get(id(attributes), -1) for attributes in recipe.attributes]
    count, index = len(values), 0
    while index < count:
        at, value = olds[index], values[index]
        if at < 0:
            line = next(added)
            head = line[: line.rindex(b" ") + 1]
        elif _same_text(known_values[at], value):
            # the lines as they were (most of a pod change's), as many in a row as the known text has them
            end = index + 1
            while (
                end < count
                and olds[end] == at + end - index
                and _same_text(known_values[olds[end]], values[end])
            ):
                end += 1
            first, last = line_start(at), line_start(at + end - index)
            parts.append(text[first:last])
            shift = written - first
            value_starts.extend([start + shift for start in starts[at : at + end - index]])
            written += last - first
            index = end
            continue
        else:
            head = text[line_start(at) : starts[at]]
        number = floatToGoString(value).encode()  # type: ignore[no-untyped-call]
        parts += (head, number, b"\n")
        value_starts.append(written + len(head))
        written += len(head) + len(number) + 1
        index += 1
    return _RenderedFamily(_kept(b"".join(parts)), value_starts, recipe, values, None)


def _same_text(before: object, value: object) -> bool:
    """Whether ``value`` is written as ``before`` was: the same number of the same type (a zero apart: a
    float's sign is written, -0.0 and 0.0 are equal)."""
    return before is value or (type(before) is type(value) and before == value and bool(value))


def _anchors(recipe: SeriesRecipe, new: list[Any]) -> list[tuple[int, Any]]:
    """Some of ``recipe``'s series (index, attributes) that, beside the ``new`` ones, hold every key of
    the recipe's series; none when the new ones hold them all."""
    missing = set(recipe.keys) - keys_of(tuple(new))
    anchors: list[tuple[int, Any]] = []
    for index, attributes in enumerate(recipe.attributes):
        if not missing:
            break
        if missing.intersection(attributes or ()):
            anchors.append((index, attributes))
            missing.difference_update(attributes or ())
    return anchors


def _header_end(text: bytes) -> int:
    """Where a family's text's comment lines (HELP, TYPE, UNIT) end."""
    at = 0
    while text.startswith(b"#", at):
        at = text.index(b"\n", at) + 1
    return at


def _rendered(family: Any, render: Callable[[OneFamily], bytes]) -> _RenderedFamily:
    """``family`` rendered through the library (a recipe's family slice by slice, not kept)."""
    if isinstance(family, ValuesFamily):
        text = family.recipe.render(family.values, render)
        if text is not None:
            starts = _value_starts(text, len(family.values))
            return _RenderedFamily(_kept(text), starts, family.recipe, family.values, None)
        whole = family.whole()  # a slice that is not one plain sample per series: the whole, as it is
        text = render(OneFamily(whole))
        return _RenderedFamily(_kept(text), _plain_starts(text, whole), family.recipe, family.values, None)
    text = render(OneFamily(family))
    return _RenderedFamily(_kept(text), _plain_starts(text, family), None, None, family)


def _plain_starts(text: bytes, family: Any) -> array[int] | None:
    if not all(plain_sample(sample) for sample in family.samples):
        return None
    return _value_starts(text, len(family.samples))


def _value_starts(text: bytes, samples: int) -> array[int] | None:
    """Where each of the ``samples`` plain samples' value starts, when each is one line after the comment
    lines. Found in place, without a bytes object per line."""
    if text and text[-1] != _NEWLINE:  # not one line each
        return None
    starts = array("i")  # 4 bytes an offset: a family's text is far below 2 GiB
    at = 0
    while at < len(text):
        end = text.index(b"\n", at)
        if text[at] != _COMMENT:
            space = text.rfind(b" ", at, end)
            if space < 0:
                return None
            starts.append(space + 1)
        at = end + 1
    return starts if len(starts) == samples else None


def _same_series(before: Any, now: Any) -> bool:
    return (
        before.type == now.type
        and before.documentation == now.documentation
        and before.unit == now.unit
        and len(before.samples) == len(now.samples)
        and all(
            a.name == b.name and (a.labels is b.labels or a.labels == b.labels) and plain_sample(b)
            for a, b in zip(before.samples, now.samples, strict=True)
        )
    )


def _with_new_values(
    known: _RenderedFamily, values: tuple[object, ...], family: Any = None
) -> _RenderedFamily:
    """``known``'s text with each sample's value replaced by ``values``' (prometheus_client's own number
    format); ``family`` is held when the family has no recipe."""
    text = known.text
    parts: list[bytes] = []
    starts = array("i")  # 4 bytes an offset: a family's text is far below 2 GiB
    written = 0  # length of the new text so far
    copied_to = 0  # how far the old text has been copied
    for start, value in zip(known.value_starts or (), values, strict=True):
        end = text.index(b"\n", start)
        head = text[copied_to:start]
        number = floatToGoString(value).encode()  # type: ignore[no-untyped-call]
        parts += (head, number)
        written += len(head)
        starts.append(written)
        written += len(number)
        copied_to = end
    parts.append(text[copied_to:])
    return _RenderedFamily(_kept(b"".join(parts)), starts, known.recipe, values, family)


WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def page_app(registry: CollectorRegistry) -> WSGIApp:
    """prometheus_client's page app for ``registry``, with a plain GET rendered through
    :class:`RenderedFamilies` and gzip-compressed here for a client that accepts it (the kept texts go out
    as they are); anything else (OPTIONS, other methods, ``name[]``) is the library's own app's,
    uncompressed (the server compresses)."""
    public = make_wsgi_app(registry, disable_compression=True)
    rendered = RenderedFamilies(generate_latest, openmetrics.generate_latest)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        query = environ.get("QUERY_STRING", "")
        if (
            environ.get("REQUEST_METHOD") != "GET"
            or environ.get("PATH_INFO") == "/favicon.ico"
            or "name[]" in parse_qs(query)
        ):
            return public(environ, start_response)  # type: ignore[no-any-return]
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT") or "")
        page = _render_with(rendered, encoder, registry)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            body = gzip_stream(page)
            headers.append(("Content-Encoding", "gzip"))
        else:
            body = plain(page)
        start_response("200 OK", headers)  # once the body is made: a failure before it is the guard's
        return [body]

    return app


def _render_with(rendered: RenderedFamilies, encoder: Callable[..., bytes], registry: Any) -> Page:
    """What ``encoder`` (one of :func:`choose_encoder`'s) writes for ``registry``, reusing unchanged
    families' text when it is one of the two encoders :class:`RenderedFamilies` knows."""
    if isinstance(encoder, functools.partial) and not encoder.args:
        if encoder.func is generate_latest:
            return rendered.text(registry, **encoder.keywords)
        if encoder.func is openmetrics.generate_latest:
            return rendered.openmetrics(registry, **encoder.keywords)
    if encoder is generate_latest:
        return rendered.text(registry)
    return [encoder(registry)]


def _plain_with(rendered: RenderedFamilies, encoder: Callable[..., bytes], registry: Any) -> bytes:
    return plain(_render_with(rendered, encoder, registry))


def _known_encoder(encoder: Callable[..., bytes]) -> bool:
    if isinstance(encoder, functools.partial) and not encoder.args:
        return encoder.func is generate_latest or encoder.func is openmetrics.generate_latest
    return encoder is generate_latest


def _check() -> str | None:
    """Every format :func:`choose_encoder` gives, rendered twice through a throwaway page with changing
    values, is byte for byte the library's."""
    from otel_numa.export.fast.reused_translations import page_differs, reuse_translations

    for accept in ("", "text/plain; version=1.0.0", "application/openmetrics-text; version=1.0.0"):
        encoder, _content_type = choose_encoder(accept)
        if not _known_encoder(encoder):  # the page would still be right, but never reuse a family's text
            return f"choose_encoder({accept!r}) gave {encoder!r}, not a partial of a known encoder"
        rendered = RenderedFamilies(generate_latest, openmetrics.generate_latest)
        why = page_differs(reuse_translations, encoder, functools.partial(_plain_with, rendered, encoder))
        if why is not None:
            return f"{why} ({accept or 'the default format'})"
    return None


PATCH = Patch(
    name="rendered_families",
    replaces=(
        "prometheus_client's rendering of every family on every scrape (and, for a scraper that asks for "
        "gzip, the compression of the whole page)"
    ),
    private_names=(
        "prometheus_client.utils.floatToGoString (not exported: the number format of the text encoders)",
        "prometheus_client.exposition.choose_encoder returning functools.partial of generate_latest",
    ),
    check=_check,
    requires=("reused_translations",),
)
