"""Compose's variable interpolation, for tests that read docker-compose.yaml without a compose tool."""

from __future__ import annotations

import re
from collections.abc import Mapping

# ${NAME}, ${NAME:-default} and ${NAME-default}, as the Compose Specification defines them
_VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<colon>:?)-(?P<default>[^}]*))?\}")


def interpolate(text: str, environment: Mapping[str, str] | None = None) -> str:
    """``text`` with each variable replaced as compose would, from ``environment`` (default: none set)."""
    values = environment or {}

    def value(match: re.Match[str]) -> str:
        name, default = match.group("name"), match.group("default")
        if default is None:
            return values.get(name, "")
        if match.group("colon"):
            return values.get(name) or default
        return values.get(name, default)

    return _VARIABLE.sub(value, text)
