"""Per-offset completion tracking for one chunk: a bitmap plus a popcount (``docs/design.md`` §3).

An offset closes once all of its children were delivered or tombstoned:
children 0..k where child k carries ``is_last_child``. Children are counted,
not assumed to arrive in order. ``complete`` is O(1).
"""

from __future__ import annotations


class ChunkProgress:
    __slots__ = ("chunk_id", "size", "closed", "popcount", "children")

    def __init__(self, chunk_id: int, size: int):
        self.chunk_id = chunk_id
        self.size = size
        self.closed = bytearray(size)
        self.popcount = 0
        # offset -> (distinct children seen, index of the last child or -1 while unknown)
        self.children: dict[int, list] | None = None

    @property
    def complete(self) -> bool:
        return self.popcount == self.size

    def close_child(self, offset: int, child: int, is_last: bool) -> None:
        if child == 0 and is_last:
            self._close(offset)
            return
        if self.children is None:
            self.children = {}
        st = self.children.get(offset)
        if st is None:
            st = self.children[offset] = [set(), -1]
        st[0].add(child)  # a set: a child reported twice must not stand in for a missing one
        if is_last:
            st[1] = child
        if st[1] >= 0 and len(st[0]) == st[1] + 1:
            del self.children[offset]
            self._close(offset)

    def _close(self, offset: int) -> None:
        if not self.closed[offset]:
            self.closed[offset] = 1
            self.popcount += 1
