"""Progress bars for long one-time steps (indexing footers, converting shards).

tqdm draws them where it is installed (the ``parquet``/``s3``/``cli`` extras bring it);
without it a step runs without a bar: a bar is a nicety, never a requirement.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["progress_bar"]


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(total: int, desc: str, unit: str, show: bool) -> Any:
    """A bar with ``update(n)`` and ``close()`` on stderr, or a silent stand-in."""
    if not show:
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr)
