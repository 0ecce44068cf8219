"""Progress of long one-time steps (indexing footers, converting shards), on stderr.

On a terminal: a tqdm bar (the ``parquet``/``s3``/``cli`` extras bring tqdm) whose
postfix shows the current item's progress (``note``), e.g. the rows of the shard being
converted. Elsewhere -- a pipe, a log file, a CI job -- a bar's carriage returns turn
into one garbled line, so each finished item is one plain line instead
(``converting to Parquet: 2/7 shards (b.jsonl.zst: 12,345 rows)``), at most about 100
of them; so is a terminal without tqdm. ``show=False`` shows nothing.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["progress_bar"]


class _NoBar:
    def update(self, n: int = 1, note: str | None = None) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class _Bar(_NoBar):
    """A tqdm bar; ``note`` sets its postfix."""

    def __init__(self, bar: Any):
        self._bar = bar

    def update(self, n: int = 1, note: str | None = None) -> None:
        if note is not None:
            self._bar.set_postfix_str(note, refresh=False)
        self._bar.update(n)

    def note(self, text: str) -> None:
        self._bar.set_postfix_str(text)

    def close(self) -> None:
        self._bar.close()


class _Lines(_NoBar):
    """A line per ``update``, flushed (a pipe is block-buffered); at most about 100 lines
    in all (every ``total // 100`` items: indexing 10,000 footers is 100 lines)."""

    def __init__(self, total: int, desc: str, unit: str):
        self.done, self.total, self.desc, self.unit = 0, total, desc, unit
        self.every = max(1, total // 100)

    def update(self, n: int = 1, note: str | None = None) -> None:
        before, self.done = self.done, self.done + n
        if self.done < self.total and self.done // self.every == before // self.every:
            return
        unit = self.unit if self.total == 1 else f"{self.unit}s"
        tail = f" ({note})" if note else ""
        sys.stderr.write(f"{self.desc}: {self.done}/{self.total} {unit}{tail}\n")
        sys.stderr.flush()


def progress_bar(total: int, desc: str, unit: str, show: bool) -> Any:
    """A progress display with ``update(n, note=None)``, ``note(text)`` and ``close()``
    on stderr: a bar on a terminal, a line per update elsewhere, or a silent stand-in."""
    if not show:
        return _NoBar()
    if sys.stderr.isatty():
        try:
            from tqdm.auto import tqdm
        except ImportError:
            pass
        else:
            return _Bar(tqdm(total=total, desc=desc, unit=unit, file=sys.stderr))
    return _Lines(total, desc, unit)
