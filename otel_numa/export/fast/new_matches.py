"""Where patches get hold of the view-instrument matches of the agent's instruments.

The SDK makes an instrument's matches in a reader storage at its first measurement
(``MetricReaderStorage._get_or_init_view_instrument_match``, called for every measurement). Making them
earlier would change the order of the metrics in every export, so the patches that replace a method of
a match are handed each match as the SDK makes it, by one stand-in per storage that removes itself once
every instrument has its matches (from then on the SDK's own method serves each measurement).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

_NAME = "_get_or_init_view_instrument_match"

MatchHook = Callable[[Any], None]


class _Hooks:
    """Stands in for one storage's ``_get_or_init_view_instrument_match`` until every instrument was seen."""

    def __init__(self, storage: Any, instruments: Iterable[Any]) -> None:
        self._storage = storage
        self._matches_for = getattr(storage, _NAME)  # the SDK's, bound to the storage
        self._waiting = {id(instrument): instrument for instrument in instruments}
        self.hooks: list[MatchHook] = []

    def __call__(self, instrument: Any) -> Any:
        matches = self._matches_for(instrument)
        if self._waiting.pop(id(instrument), None) is not None:
            for match in matches:
                for hook in self.hooks:
                    hook(match)
            if not self._waiting and vars(self._storage).get(_NAME) is self:
                delattr(self._storage, _NAME)
        return matches


def on_new_matches(storage: Any, instruments: Iterable[Any], hook: MatchHook) -> None:
    """Call ``hook`` with each match ``storage`` makes for one of ``instruments`` (all of them made by the
    time a patch is applied; a patch applied later hooks the instruments still without matches)."""
    hooks = vars(storage).get(_NAME)
    if not isinstance(hooks, _Hooks):
        hooks = _Hooks(storage, instruments)
        setattr(storage, _NAME, hooks)
    hooks.hooks.append(hook)
