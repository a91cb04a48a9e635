"""Notices within milliseconds when the kubelet rewrites one of its checkpoint files.

The kubelet writes a checkpoint to a temporary file beside it, fsyncs it and renames it over the old one, so
the change shows up as a rename into the directory (IN_MOVED_TO). The directories holding the checkpoints are
watched, non-recursively, with inotify (:func:`inotify_batches`, through the inotify_simple binding); a watch
only needs read access, so a read-only mount works. The watching thread sleeps in ``poll(2)`` until the kernel
has an event, the identity check below is due, or the watcher is stopped (a pipe wakes it): an idle node costs
one wakeup per ``poll_interval_s``. Events are
grouped until the directory has been quiet for ``settle_ms`` (the kubelet rewrites several files per pod
admission), at most ``max_batch_ms``, then ``on_change`` is called once. Rate-limiting the exports that follow
is the scheduler's job.

Once per ``poll_interval_s`` the identity (device, inode) of each directory is checked: a kubelet restart
that deletes and re-creates the directory, or a mount placed over it, leaves the old watch blind, so the watch
is set up again on the new directory. When the watch cannot be set up at all (no inotify, too many instances
or watches), the files' stat signatures are polled every ``poll_interval_s`` instead; that is logged once,
and the watch is tried again every ``watch_retry_s``.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, Literal

from inotify_simple import INotify, flags

from otel_numa.sources.files import StatSignature

log = logging.getLogger(__name__)
# Each wakeup of an idle agent costs ~0.24 ms of CPU on a small VM (cold caches, the GIL): at 1 s the
# directory check was a fifth of the idle agent's CPU. A mount over a directory (the only change inotify
# does not report) and, where inotify is unavailable, a checkpoint change are still seen within 5 s, and
# the scheduled rounds read the checkpoints anyway.
DEFAULT_POLL_INTERVAL_S = 5.0

# A source of batches of (change, path), as inotify_batches yields them; tests put a failing stand-in in
# its place.
WatchBackend = Callable[..., Iterator[set[tuple[Any, str]]]]

_EVENTS = (
    flags.CREATE
    | flags.DELETE
    | flags.MODIFY
    | flags.CLOSE_WRITE
    | flags.MOVED_FROM
    | flags.MOVED_TO
    | flags.ATTRIB
    | flags.DELETE_SELF
    | flags.MOVE_SELF
)
STOP_CHECK_MS = 250  # how soon a stop is noticed while nothing happens, when the stop flag has no fileno()


class WakingEvent(threading.Event):
    """A stop flag whose :meth:`fileno` becomes readable when it is set, so a thread sleeping in ``poll(2)``
    wakes at once instead of checking the flag a few times a second (each wakeup costs CPU on every node)."""

    def __init__(self) -> None:
        super().__init__()
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)

    def fileno(self) -> int:
        return self._read_fd

    def set(self) -> None:
        super().set()
        if self._write_fd >= 0:
            with suppress(BlockingIOError):  # the pipe is full: it is readable already
                os.write(self._write_fd, b"x")

    def close(self) -> None:
        """Close the pipe, once nobody waits on it any more (a closed number may be reused at once)."""
        for fd in (self._read_fd, self._write_fd):
            if fd >= 0:
                os.close(fd)
        self._read_fd = self._write_fd = -1


def inotify_batches(
    *directories: Path,
    debounce: int,
    step: int,
    stop_event: threading.Event,
    rust_timeout: int,
    **_unused: object,
) -> Iterator[set[tuple[int, str]]]:
    """Batches of (event mask, path) for changes in ``directories`` (not recursive): an empty batch as soon
    as the watch is live; then a batch once they have been quiet for ``step`` ms, at most ``debounce`` ms
    after its first event; an empty batch every ``rust_timeout`` ms without events; nothing after
    ``stop_event``. A path is the directory itself when the directory was deleted or moved. Raises OSError
    when a watch cannot be set up (no inotify, limits).

    A ``stop_event`` with a ``fileno()`` (:class:`WakingEvent`) is waited on beside the watch; any other is
    checked every ``STOP_CHECK_MS``."""
    stop_fileno = getattr(stop_event, "fileno", None)
    nap_ms = rust_timeout if stop_fileno is not None else min(rust_timeout, STOP_CHECK_MS)
    inotify = INotify()
    try:
        names = {inotify.add_watch(str(directory), _EVENTS): str(directory) for directory in directories}
        poller = select.poll()
        poller.register(inotify.fileno(), select.POLLIN)
        if stop_fileno is not None:
            poller.register(stop_fileno(), select.POLLIN)
        yield set()  # the watch is live: the caller may catch up on what changed before
        quiet_since = time.monotonic()
        while not stop_event.is_set():
            quiet_ms = (time.monotonic() - quiet_since) * 1000
            poller.poll(max(0, min(nap_ms, round(rust_timeout - quiet_ms))))
            events = inotify.read(timeout=0)
            if not events:
                if time.monotonic() - quiet_since >= rust_timeout / 1000:
                    quiet_since = time.monotonic()
                    yield set()
                continue
            batch: set[tuple[int, str]] = set()
            first = time.monotonic()
            while events:
                for event in events:
                    directory = names.get(event.wd)
                    if directory is not None:
                        batch.add(
                            (event.mask, os.path.join(directory, event.name) if event.name else directory)
                        )
                if (time.monotonic() - first) * 1000 >= debounce:
                    break
                events = inotify.read(timeout=step)
            quiet_since = time.monotonic()
            yield batch
    finally:
        inotify.close()


WatcherMode = Literal["starting", "watching", "polling", "stopped"]
DirectoryIdentity = tuple[int, int] | None  # (st_dev, st_ino); None when the directory does not exist


def _directory_identity(path: Path) -> DirectoryIdentity:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class CheckpointWatcher:
    """Calls ``on_change`` (from its own thread) soon after any of ``files`` is replaced, written or removed.

    ``notifications`` counts the calls by cause: ``event`` (a watch event), ``catch-up`` (a file changed while
    no watch was live, noticed when a watch started), ``poll`` (polling fallback).
    """

    def __init__(
        self,
        files: Iterable[Path],
        on_change: Callable[[], None],
        *,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        settle_ms: int = 20,
        max_batch_ms: int = 100,
        watch_retry_s: float = 60.0,
        backend: WatchBackend = inotify_batches,
    ) -> None:
        self._files = tuple(Path(os.path.abspath(path)) for path in files)
        self._names = frozenset(path.name for path in self._files)
        self._directories = tuple(dict.fromkeys(path.parent for path in self._files))
        self._directory_names = frozenset(str(directory) for directory in self._directories)
        self._on_change = on_change
        self._poll_interval_s = poll_interval_s
        self._settle_ms = settle_ms
        self._max_batch_ms = max_batch_ms
        self._watch_retry_s = watch_retry_s
        self._backend = backend
        self._stop = WakingEvent()
        self._thread = threading.Thread(target=self._run, name="otel-numa-watch", daemon=True)
        self._signatures = self._file_signatures()
        self._retry_watch_at = 0.0
        self._failure_logged = False
        self.mode: WatcherMode = "starting"
        self.watches_started = 0
        self.notifications: Counter[str] = Counter()

    @property
    def directories(self) -> tuple[Path, ...]:
        return self._directories

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._stop.close()
        self.mode = "stopped"

    # The loop ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            identities = self._directory_identities()
            present = [directory for directory, identity in identities.items() if identity is not None]
            if present and time.monotonic() >= self._retry_watch_at:
                try:
                    self._watch(present, identities)
                    continue
                except (OSError, RuntimeError) as failure:
                    if self._directory_identities() != identities:
                        continue  # the directory went away under us: not a failure of the watch
                    self._fall_back(failure)
            # Polling: the fallback, or no directory to watch yet (the kubelet has not started).
            self.mode = "polling"
            self._check_signatures("poll")
            self._stop.wait(self._poll_interval_s)

    def _watch(self, directories: Sequence[Path], identities: dict[Path, DirectoryIdentity]) -> None:
        """Watch until stopped or until a directory is replaced (then return, to watch the new one)."""
        batches = self._backend(
            *directories,
            watch_filter=None,
            debounce=self._max_batch_ms,
            step=self._settle_ms,
            stop_event=self._stop,
            rust_timeout=max(1, round(self._poll_interval_s * 1000)),
            yield_on_timeout=True,
            recursive=False,
            raise_interrupt=False,
        )
        try:
            self._follow(batches, directories, identities)
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # ends the backend's watch (and its thread) now, not when garbage is collected

    def _follow(
        self,
        batches: Iterator[set[tuple[Any, str]]],
        directories: Sequence[Path],
        identities: dict[Path, DirectoryIdentity],
    ) -> None:
        established = False
        next_identity_check = 0.0
        for batch in batches:
            if not established:
                # The first batch (or timeout) means the watch is live: catch up on changes made before.
                established = True
                self._watch_established(directories)
            if any(os.path.basename(path) in self._names for _, path in batch):
                self._signatures = self._file_signatures()
                self._notify("event")
            if self._stop.is_set():
                return
            if any(path in self._directory_names for _, path in batch):
                # A watched directory itself was removed, moved or created: its watch may be dead or missing.
                return
            now = time.monotonic()
            if now >= next_identity_check:
                # A mount placed over a directory makes no event; a new directory usually has a new inode.
                next_identity_check = now + self._poll_interval_s
                if self._directory_identities() != identities:
                    return

    def _watch_established(self, directories: Sequence[Path]) -> None:
        self.watches_started += 1
        self.mode = "watching"
        if self._failure_logged:
            log.info("watching %s for kubelet checkpoint changes again", ", ".join(map(str, directories)))
            self._failure_logged = False
        self._check_signatures("catch-up")

    def _fall_back(self, failure: BaseException) -> None:
        self._retry_watch_at = time.monotonic() + self._watch_retry_s
        if not self._failure_logged:
            self._failure_logged = True
            log.warning(
                "cannot watch %s for kubelet checkpoint changes (%s); polling their stat signatures "
                "every %g s",
                ", ".join(map(str, self._directories)),
                failure,
                self._poll_interval_s,
            )

    # Helpers ----------------------------------------------------------------------------------------

    def _directory_identities(self) -> dict[Path, DirectoryIdentity]:
        return {directory: _directory_identity(directory) for directory in self._directories}

    def _file_signatures(self) -> tuple[StatSignature | None, ...]:
        return tuple(StatSignature.of(path) for path in self._files)

    def _check_signatures(self, cause: str) -> None:
        current = self._file_signatures()
        if current != self._signatures:
            self._signatures = current
            self._notify(cause)

    def _notify(self, cause: str) -> None:
        self.notifications[cause] += 1
        try:
            self._on_change()
        except Exception:  # the callback's failure must not end the watch
            log.exception("reacting to a kubelet checkpoint change failed")
