"""One gzip stream put together from texts compressed at different times.

Prometheus asks for every page gzip-compressed. Most of a page is the text of families that did not change
since the last scrape, kept compressed between scrapes; compressing the whole page anew would redo that
work at every scrape. Instead a kept text is a :class:`Segment`: raw deflate ended by a sync flush (whole
bytes, no final block, and, made by a compressor of its own, no reference to anything before it). A page is
then one gzip member (RFC 1952): the segments as they are, the texts that changed compressed between them
by one compressor that forgets its history at each segment (a full flush), a final empty block, and the
CRC-32 and length of the whole. The CRC-32 of a concatenation follows from its parts' CRCs and lengths,
since the CRC is linear over GF(2). One member, not one per text: curl and browsers stop reading at the end
of the first.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable

# Prometheus always asks for gzip. prometheus_client compresses at level 9, which on a 3 MB page (8 NUMA
# nodes, 1,000 containers) takes 48 ms; level 3 takes 6 ms for a page 40% larger (95 instead of 66 KiB),
# and the same 0.8 ms as level 1 on a 2-node page: a node agent's CPU is the scarcer resource.
GZIP_LEVEL = 3

_RAW = -zlib.MAX_WBITS  # raw deflate: no zlib or gzip header
# gzip magic, deflate, no flags, no modification time, no extra flags, operating system unknown
_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
# a final block of fixed codes holding nothing but its end: what a deflate stream ends with when its
# last bytes were flushed already
_EMPTY_FINAL_BLOCK = b"\x03\x00"

# CRC-32 of RFC 1952 in zlib's bit-reflected form: bit 31 holds the coefficient of x^0
_POLYNOMIAL = 0xEDB88320
_ONE = 1 << 31  # x^0


def _times(a: int, b: int) -> int:
    """a(x) * b(x) modulo the CRC-32 polynomial (both reflected)."""
    product = 0
    bit = _ONE
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ _POLYNOMIAL if b & 1 else b >> 1
    return product


def _squares() -> tuple[int, ...]:
    """x^(2^k) for k = 0 .. 63."""
    powers = [_ONE >> 1]  # x^1
    while len(powers) < 64:
        powers.append(_times(powers[-1], powers[-1]))
    return tuple(powers)


_X_TO_TWO_TO_THE = _squares()


def crc_shift(size: int) -> int:
    """x^(8 * size): what the CRC-32 of a text is multiplied by when ``size`` bytes follow it."""
    shift, k = _ONE, 3  # x^(8 * 2^j) = x^(2^(j + 3))
    while size:
        if size & 1:
            shift = _times(_X_TO_TWO_TO_THE[k], shift)
        size >>= 1
        k += 1
    return shift


def crc_combined(first: int, second: int, second_shift: int) -> int:
    """The CRC-32 of text A followed by text B, from CRC-32(A), CRC-32(B) and crc_shift(len(B))."""
    return _times(second_shift, first) ^ second


class Segment:
    """A text kept as a raw deflate segment that a gzip stream can take as it is."""

    __slots__ = ("_shift", "crc", "deflated", "size")

    def __init__(self, text: bytes, level: int) -> None:
        compressor = zlib.compressobj(level, zlib.DEFLATED, _RAW)
        self.deflated = compressor.compress(text) + compressor.flush(zlib.Z_SYNC_FLUSH)
        self.size = len(text)
        self.crc = zlib.crc32(text)
        self._shift: int | None = None  # worked out by the first gzip page that takes the segment

    def text(self) -> bytes:
        return zlib.decompressobj(_RAW).decompress(self.deflated)

    @property
    def shift(self) -> int:
        if self._shift is None:
            self._shift = crc_shift(self.size)
        return self._shift


def gzip_stream(parts: Iterable[Segment | bytes], level: int = GZIP_LEVEL) -> bytes:
    """One gzip member of ``parts`` in order: segments as they are, plain texts compressed at ``level``."""
    out = [_HEADER]
    crc = size = 0
    compressor = None
    holding = False  # whether the compressor took text since it last flushed
    for part in parts:
        if isinstance(part, Segment):
            if holding:
                assert compressor is not None
                out.append(compressor.flush(zlib.Z_FULL_FLUSH))  # whole bytes, and no reference back
                holding = False
            out.append(part.deflated)
            crc = crc_combined(crc, part.crc, part.shift)
            size += part.size
        elif part:
            if compressor is None:
                compressor = zlib.compressobj(level, zlib.DEFLATED, _RAW)
            out.append(compressor.compress(part))
            crc = zlib.crc32(part, crc)
            size += len(part)
            holding = True
    out.append(compressor.flush(zlib.Z_FINISH) if compressor is not None else _EMPTY_FINAL_BLOCK)
    out.append(struct.pack("<II", crc, size & 0xFFFFFFFF))
    return b"".join(out)
