"""The process's heap: what the agent does so that a long-running process stays small and collects
cheaply."""

from __future__ import annotations

import ctypes
import gc
import math
import threading
import time
from collections.abc import Callable

_frozen = threading.Event()

# Objects the cyclic collector lets pile up before it looks at the young ones (Python's default is 700):
# twice what the first collection left alive (frozen), at least 50,000. What a round keeps (Measurements,
# data points, samples, parsed cgroup files) is made anew every round and freed by reference counting,
# and a round makes no reference cycles: with the default, the collector scanned that state dozens of
# times a round and found nothing, a seventh of a round's CPU on the 2x32 node and a third on the 8x48
# node, whose rounds make ~100,000 objects before freeing the last round's. Real garbage is still
# collected once that many objects pile up.
YOUNG_OBJECTS_BEFORE_COLLECTION = 50_000


def freeze_long_lived_objects() -> None:
    """After the first whole collection, move what exists then (imports, the SDK's per-series state, the
    instruments' cached observations) out of the cyclic collector's reach: later collections then only
    scan what they create, which is what made garbage collection cost microseconds per series. From then
    on the collector looks at young objects only once twice as many as were frozen have piled up."""
    if not _frozen.is_set():
        _frozen.set()
        gc.collect()
        gc.freeze()
        _, middle, old = gc.get_threshold()
        gc.set_threshold(max(YOUNG_OBJECTS_BEFORE_COLLECTION, 2 * gc.get_freeze_count()), middle, old)
        release_free_memory()


TIDY_GAP_S = 60.0  # the free lists grow by a few KB a minute: emptying them once a minute is plenty
_last_tidy = -math.inf


def tidy_after_round() -> None:
    """At the end of a background round on the timer, at most once a minute: a full collection, which
    also empties the interpreter's free lists (the tuples, lists, dicts and floats it keeps for reuse, up
    to 2,000 tuples of each length up to 20), then the free pages back to the system. Nothing else empties
    those lists, and with the collector waiting for many young objects (above) no full collection comes:
    they only grew. A tuple built from a generator is allocated at a guessed length and resized, so it
    leaves one length's free list and joins another's, a few per scrape; on the 2x32 node the lists held
    ~1.8 MB after 1,000 scrapes. The collection scans all that is not frozen: ~1.3 ms on the 2x32 node,
    5-10 ms on the 8x48 node, more where much was made after the freeze (a process that runs an agent
    beside other work)."""
    global _last_tidy
    now = time.monotonic()
    if now - _last_tidy < TIDY_GAP_S:
        return
    _last_tidy = now
    gc.collect()
    release_free_memory()


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        process = ctypes.CDLL(None)  # the symbols already loaded, the C library's among them
    except OSError:
        return None
    return getattr(process, "malloc_trim", None)  # glibc only


_TRIM = _malloc_trim()


def release_free_memory() -> None:
    """Give the pages that freed memory left behind back to the system (glibc's ``malloc_trim``). Python
    frees a collection's and an encoding's temporary objects, but the C allocator keeps their pages: the
    first OTLP encoding alone leaves ~3 MB on a node with 1,700 series. Takes well under a millisecond;
    nothing happens where the C library has no such call."""
    if _TRIM is not None:
        _TRIM(0)
