"""The one read helper of the sources and the name rule, on hostile inputs: this machine's own files and
files made here (FIFOs, links, sparse files, file names of invalid UTF-8)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from otel_numa.model import MAX_NAME_LENGTH, shared_name, valid_name
from otel_numa.sources.errors import SourceCorrupt, SourceMissing, SourceUnavailable
from otel_numa.sources.files import SYSFS_FILE_BYTES, parse_cpulist, read_bytes, read_text


def test_real_kernel_files_are_read_whole() -> None:
    stat = read_text("/proc/stat", limit=8 << 20)
    assert stat.startswith("cpu ") and stat.endswith("\n")
    online = Path("/sys/devices/system/cpu/online")
    if online.exists():
        assert parse_cpulist(read_text(online)) == parse_cpulist(online.read_text())


def test_a_fifo_with_a_silent_writer_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "meminfo"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR)  # a writer that never writes
    try:
        started = time.monotonic()
        with pytest.raises(SourceCorrupt) as raised:
            read_bytes(fifo, limit=SYSFS_FILE_BYTES)
        assert raised.value.error_type == "not_regular_file"
        assert time.monotonic() - started < 1.0
    finally:
        os.close(writer)


def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "stat"
    os.mkfifo(fifo)
    done = threading.Event()

    def read() -> None:
        with pytest.raises(SourceCorrupt):
            read_bytes(fifo, limit=SYSFS_FILE_BYTES)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(5), "opening a FIFO without a writer blocked"


def test_a_link_is_not_followed_and_its_target_never_quoted(tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret:19000::::::\n")
    link = tmp_path / "cpulist"
    link.symlink_to(secret)
    with pytest.raises(SourceCorrupt) as raised:
        read_text(link)
    assert raised.value.error_type == "symlink"
    assert "secret" not in str(raised.value).replace(str(tmp_path), "")


def test_a_sparse_gigabyte_is_refused_after_its_cap(tmp_path: Path) -> None:
    sparse = tmp_path / "meminfo"
    with open(sparse, "wb") as file:
        file.truncate(1 << 30)
    with pytest.raises(SourceCorrupt) as raised:
        read_bytes(sparse, limit=SYSFS_FILE_BYTES)
    assert raised.value.error_type == "too_large"


def test_missing_and_directory(tmp_path: Path) -> None:
    with pytest.raises(SourceMissing):
        read_bytes(tmp_path / "absent", limit=10)
    with pytest.raises(SourceUnavailable):
        read_bytes(tmp_path, limit=10)


def test_a_file_at_its_cap_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "exact"
    path.write_bytes(b"x" * 100_000)
    assert len(read_bytes(path, limit=100_000)) == 100_000
    with pytest.raises(SourceCorrupt):
        read_bytes(path, limit=99_999)


def test_cpu_lists_beyond_the_limit_are_refused_without_expanding() -> None:
    with pytest.raises(SourceCorrupt) as raised:
        parse_cpulist("0-65535", 31)
    assert raised.value.error_type == "out_of_range"
    with pytest.raises(SourceCorrupt) as raised:
        parse_cpulist("0-3,root:$6$x")
    assert "root" not in str(raised.value)


def test_file_names_of_invalid_utf8_become_valid_names(tmp_path: Path) -> None:
    raw = b"pod\xff\xferaw_ns\xc3_c\x80bad"
    (tmp_path / os.fsdecode(raw)).touch()
    (listed,) = os.listdir(tmp_path)
    name = shared_name(listed)
    assert name == "pod\ufffd\ufffdraw_ns\ufffd_c\ufffdbad"
    name.encode("utf-8")  # no lone surrogate is left
    assert valid_name("a\ud800b") == "a\ufffd\ufffd\ufffdb"  # a lone surrogate from a JSON escape
    assert len(valid_name("x" * 10_000)) == MAX_NAME_LENGTH
    assert valid_name("web-0") == "web-0"
