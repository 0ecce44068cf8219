"""Packages whose public names load on first use (PEP 562).

``import zephon_core.checkpoint.codec`` runs ``zephon_core/__init__.py`` first, and
``zephon --help`` imports the CLI's modules; neither should pay for torch and the
engine. A package lists where each public name lives and re-exports it lazily; its
``if TYPE_CHECKING:`` imports keep type checkers and the API reference informed.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, where: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``; ``where`` maps each public
    name to the (relative) module that defines it."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__
