"""A shard manifest inside a content fingerprint comes from a checkpoint file, which may
be crafted: reading it must stay bounded."""

from __future__ import annotations

import base64
import tracemalloc
import zlib

from zephon_core.digests.manifest import SEP, describe_change, differs, digest_of


def test_a_manifest_that_inflates_without_bound_is_taken_for_none():
    bomb = "rows:abc" + SEP + base64.b64encode(zlib.compress(b"0" * (200 << 20), 9)).decode()
    tracemalloc.start()
    try:
        assert digest_of(bomb) == "rows:abc"
        assert not differs(bomb, "rows:abc")
        assert describe_change(bomb, bomb) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"reading the manifest took {peak >> 20} MB"
