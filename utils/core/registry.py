"""One pattern for every registry of named variants (engines, retrievers, scorers, dataset adapters,
advantages, aggregations, policy losses, LoRA forwards): a read-only mapping whose `get` names the
valid choices when a name is unknown. docs/EXTENDING.md lists them and what adding one takes."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Mapping, Generic[T]):
    """Named entries of one kind, `what` naming the kind in errors ("engine", "loss aggregation")."""

    def __init__(self, what: str, entries: Mapping[str, T]):
        self.what = what
        self._entries = dict(entries)

    def get(self, name: str) -> T:  # noqa: D102 - unlike Mapping.get, an unknown name is an error
        if name not in self._entries:
            raise KeyError(f"unknown {self.what} '{name}'; valid: {', '.join(self.names)}")
        return self._entries[name]

    @property
    def names(self) -> tuple[str, ...]:
        """The registered names, sorted."""
        return tuple(sorted(self._entries))

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}, {', '.join(self._entries)})"
