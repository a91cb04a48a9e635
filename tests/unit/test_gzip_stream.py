"""A gzip page put together from kept deflate segments and fresh text is one valid gzip member."""

from __future__ import annotations

import gzip
import random
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from otel_numa.gzip_stream import Segment, crc_combined, crc_shift, gzip_stream


def plain_of(parts: list[Segment | bytes]) -> bytes:
    return b"".join(part.text() if isinstance(part, Segment) else part for part in parts)


def members(body: bytes) -> int:
    """How many gzip members ``body`` holds (each must be whole)."""
    count = 0
    while body:
        reader = zlib.decompressobj(zlib.MAX_WBITS | 16)
        reader.decompress(body)
        assert reader.eof, "a member is cut short"
        body = reader.unused_data
        count += 1
    return count


def family_text(rng: random.Random, lines: int) -> bytes:
    return b"".join(
        b'numa_container_memory_usage_bytes{k8s_pod_uid="%d",numa_node_id="%d"} %d\n'
        % (rng.randrange(10**6), rng.randrange(8), rng.randrange(10**12))
        for _ in range(lines)
    )


def test_the_crc_of_a_concatenation_follows_from_its_parts() -> None:
    rng = random.Random(7)
    for _ in range(300):
        first, second = rng.randbytes(rng.randrange(0, 3000)), rng.randbytes(rng.randrange(0, 3000))
        expected = zlib.crc32(first + second)
        assert crc_combined(zlib.crc32(first), zlib.crc32(second), crc_shift(len(second))) == expected
    long = b"x" * 1_234_567
    assert crc_combined(zlib.crc32(b"head"), zlib.crc32(long), crc_shift(len(long))) == zlib.crc32(
        b"head" + long
    )


def test_a_segment_is_raw_deflate_ended_on_a_byte_without_a_final_block() -> None:
    text = family_text(random.Random(1), 200)
    segment = Segment(text, 1)
    assert segment.text() == text and segment.size == len(text) and segment.crc == zlib.crc32(text)
    assert segment.deflated.endswith(b"\x00\x00\xff\xff")  # the sync flush's empty stored block
    reader = zlib.decompressobj(-zlib.MAX_WBITS)
    assert reader.decompress(segment.deflated) == text and not reader.eof  # the stream goes on


@pytest.mark.parametrize(
    "shape",
    ["segments and text", "segments only", "text only", "nothing", "text last", "empty texts between"],
)
def test_a_page_of_segments_and_text_is_one_gzip_member_of_the_whole(shape: str, tmp_path: Path) -> None:
    rng = random.Random(shape)
    big = [Segment(family_text(rng, rng.randrange(30, 400)), 1) for _ in range(4)]
    small = [family_text(rng, rng.randrange(1, 5)) for _ in range(4)]
    shapes: dict[str, list[Segment | bytes]] = {
        "segments and text": [small[0], big[0], big[1], small[1], big[2], small[2], big[3], b"# EOF\n"],
        "segments only": list(big),
        "text only": list(small),
        "nothing": [],
        "text last": [big[0], small[0], small[1]],
        "empty texts between": [b"", big[0], b"", b"", big[1], b""],
    }
    parts = shapes[shape]
    body = gzip_stream(parts)
    assert members(body) == 1  # curl and browsers read no further than the first
    assert gzip.decompress(body) == plain_of(parts)
    # the gzip program checks the CRC and the length of what it unpacks
    file = tmp_path / "page.gz"
    file.write_bytes(body)
    gunzip = shutil.which("gzip")
    assert gunzip is not None
    assert subprocess.run([gunzip, "-t", str(file)], capture_output=True).returncode == 0
    unpacked = subprocess.run([gunzip, "-dc", str(file)], capture_output=True, check=True).stdout
    assert unpacked == plain_of(parts)


def test_kept_segments_go_out_as_they_are() -> None:
    rng = random.Random(3)
    kept = Segment(family_text(rng, 500), 1)
    body = gzip_stream([b"# changed\n", kept, b"# changed too\n"])
    assert kept.deflated in body
    # a corrupted CRC is refused: the trailer is checked, not decorative
    broken = body[:-8] + bytes([body[-8] ^ 1]) + body[-7:]
    with pytest.raises(gzip.BadGzipFile, match="CRC"):
        gzip.decompress(broken)
