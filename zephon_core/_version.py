"""The library version, in a module of its own so the checkpoint schema can record it
without importing the package root."""

from __future__ import annotations

__version__ = "0.1.0"
