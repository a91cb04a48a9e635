"""Files kept open between rounds read what the file holds now, refuse what read_bytes refuses, and are
opened again once their directory says an entry changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from otel_numa.sources.directory_watch import DirectoryWatch
from otel_numa.sources.errors import SourceCorrupt, SourceMissing
from otel_numa.sources.files import TOO_LARGE, KeptFiles


def test_a_kept_file_reads_what_it_holds_now(tmp_path: Path) -> None:
    path = tmp_path / "cpu.stat"
    path.write_text("usage_usec 1\n")
    files = KeptFiles(4)
    assert files.read(str(tmp_path), "cpu.stat") == b"usage_usec 1\n" and len(files) == 1
    path.write_text("usage_usec 22\n")  # in place, as the kernel's files change
    assert files.read_optional(str(tmp_path), "cpu.stat") == b"usage_usec 22\n"
    (tmp_path / "memory.numa_stat").write_text("anon N0=4096\n")
    assert files.read_kept(str(tmp_path), "cpu.stat", "memory.numa_stat") is None  # one not kept yet
    assert files.read(str(tmp_path), "memory.numa_stat") == b"anon N0=4096\n"
    assert files.read_kept(str(tmp_path), "cpu.stat", "memory.numa_stat") == (
        b"usage_usec 22\n",
        b"anon N0=4096\n",
    )
    files.forget_under(str(tmp_path))
    assert files.read(str(tmp_path), "cpu.stat") == b"usage_usec 22\n"
    with open(path, "r+b") as file:
        file.truncate(2 << 20)  # grown past the cap: refused whole, not read on
    with pytest.raises(SourceCorrupt) as refused:
        files.read(str(tmp_path), "cpu.stat", limit=1 << 20)
    assert refused.value.error_type == TOO_LARGE and len(files) == 0
    files.close()


def test_a_replaced_file_is_read_once_its_directory_is_forgotten(tmp_path: Path) -> None:
    path = tmp_path / "memory.numa_stat"
    path.write_text("anon N0=1\n")
    files = KeptFiles(4)
    watch = DirectoryWatch()
    assert watch.watch([str(tmp_path)]) == set()
    assert files.read(str(tmp_path), path.name) == b"anon N0=1\n"
    (tmp_path / "new").write_text("anon N0=2\n")
    os.replace(tmp_path / "new", path)
    assert files.read(str(tmp_path), path.name) == b"anon N0=1\n"  # the old file, through its descriptor
    changed = watch.changed()
    assert changed == {str(tmp_path)}
    for directory in changed:
        files.forget_under(directory)
    assert files.read(str(tmp_path), path.name) == b"anon N0=2\n"
    path.unlink()
    files.forget_under(str(tmp_path))
    assert files.read_optional(str(tmp_path), path.name) is None
    assert files.read_kept(str(tmp_path), path.name, path.name) is None
    with pytest.raises(SourceMissing):
        files.read(str(tmp_path), path.name)
    watch.close()


def test_files_outside_the_directories_kept_are_read_and_closed(tmp_path: Path) -> None:
    kept, other = tmp_path / "kept", tmp_path / "other"
    kept.mkdir()
    other.mkdir()
    (kept / "a").write_text("a\n")
    (other / "b").write_text("b\n")
    files = KeptFiles(4)
    files.read(str(kept), "a")
    files.read(str(other), "b")
    assert len(files) == 2
    files.retain_under({str(kept)})
    assert len(files) == 1
    assert files.read(str(other), "b") == b"b\n" and len(files) == 1
    files.close()
