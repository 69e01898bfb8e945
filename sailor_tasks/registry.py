"""Name registries: policies and strategies are selected by name, and an unknown name lists the valid ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Classes registered under a name by a class decorator; ``get`` returns the class.

    Args:
        kind: what one entry is called in messages ("policy").
        plural: the plural used in messages ("policies").
    """

    def __init__(self, kind: str, plural: str) -> None:
        self.kind, self.plural = kind, plural
        self._classes: dict[str, type[T]] = {}

    def register(self, name: str) -> Callable[[type[T]], type[T]]:
        """Class decorator: make the class selectable by ``name`` (and set its ``name`` attribute).

        Raises:
            ValueError: ``name`` is already taken by another class.
        """

        def deco(cls: type[T]) -> type[T]:
            taken = self._classes.get(name)
            if taken is not None and taken is not cls:
                raise ValueError(f"{self.kind} {name!r} is already registered by {taken.__name__}")
            cls.name = name  # type: ignore[attr-defined]
            self._classes[name] = cls
            return cls

        return deco

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._classes))

    def get(self, name: str) -> type[T]:
        """The class registered as ``name``.

        Raises:
            ValueError: unknown name; the message lists the valid names.
        """
        try:
            return self._classes[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name!r}; valid {self.plural}: {', '.join(self.names())}"
            ) from None
