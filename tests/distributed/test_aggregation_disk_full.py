"""A full disk under ``aggregate_dir``: the leader raises a typed error at once, the
followers learn it at once instead of waiting out their budget, and no temporary file
stays behind.

The disk is a real tmpfs of two 4 KiB pages, mounted in a user + mount namespace
(``unshare``) that the rank processes enter (``nsenter``). Where user namespaces are not
available, a stand-in file system (``agg_worker.install_disk_full_standin``) fails writes
with ENOSPC at the same capacity; ``disk.kind`` says which one ran.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_aggregation import (
    AMPLE_S,
    assert_failed,
    assert_failed_at_once,
    assert_files_complete,
    fault_ranks,
)

# every test here starts processes (see tests/conftest.py)
pytestmark = pytest.mark.slow

PAGE = 4096
SIZE = 2 * PAGE
MOUNT = 'mount -t tmpfs -o size=$1 tmpfs "$2" && head -c $3 /dev/zero > "$2/filler"'


@dataclass
class Disk:
    kind: str  # "tmpfs" or "stand-in"
    agg_dir: str
    prefix: list[str] = field(default_factory=list)  # runs a rank inside the namespace
    capacity: int | None = None  # the stand-in's


@contextlib.contextmanager
def full_disk(tmp_path: Path, free_pages: int) -> Iterator[Disk]:
    """A coordination directory on a disk of ``SIZE`` bytes with ``free_pages`` free."""
    agg = tmp_path / "agg"
    agg.mkdir()
    fill = SIZE - free_pages * PAGE
    script = MOUNT + " && echo ready && exec sleep 600"
    holder = None
    try:
        try:
            holder = subprocess.Popen(
                ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh"]
                + [str(SIZE), str(agg), str(fill)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        except FileNotFoundError:  # no util-linux
            holder = None
        if holder is not None and holder.stdout.readline().strip() == "ready":
            enter = ["nsenter", f"--target={holder.pid}", "--user", "--mount", "--"]
            yield Disk("tmpfs", str(agg), enter)
        else:
            (agg / "filler").write_bytes(b"\0" * fill)
            yield Disk("stand-in", f"diskfull://{agg}", capacity=SIZE)
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()


def _ranks(tmp_path: Path, disk: Disk, timeout: float):
    """Two ranks; the leader starts its round once the follower is already waiting for it
    (so the follower sees the announcement change, as when ranks arrive together)."""
    extra = {} if disk.capacity is None else {"disk_capacity": disk.capacity}
    ranks = fault_ranks(
        tmp_path,
        2,
        timeout,
        agg_dir=disk.agg_dir,
        per_rank={
            0: dict(round=dict(wait_files=["announce_polled.r1"]), **extra),
            1: dict(faults=["signal_first_announce_poll"], **extra),
        },
    )
    ranks.prefix = disk.prefix
    return ranks


@pytest.mark.parametrize("free_pages", [0, 1], ids=["announce-fails", "report-fails"])
def test_a_full_disk_fails_every_rank_at_once_and_leaves_no_temporary_file(tmp_path, free_pages):
    with full_disk(tmp_path, free_pages) as disk:
        ranks = _ranks(tmp_path, disk, AMPLE_S)
        logs = ranks.logs(ranks.run())
    lead, fol = logs["r0"]["rounds"][0], logs["r1"]["rounds"][0]
    what = f"({disk.kind}, {free_pages} free pages)"
    assert_failed(lead, "AggregationError", f"leader {what}")
    assert "No space left on device" in lead["error"], lead["error"]
    assert "storage is full" in lead["error"], lead["error"]
    assert_failed(fol, "AggregationError", f"follower {what}")
    assert "full" in fol["error"], fol["error"]
    assert_failed_at_once(fol, f"the follower {what}")
    for tag, entry in (("leader", lead), ("follower", fol)):
        files = {n: b for n, b in entry["dir_after"].items() if n != "filler"}
        assert_files_complete(files, f"{tag} after the failed round {what}")
        assert not [n for n in files if ".state." in n], (
            f"{tag}: a failed round must not leave states {what}: {sorted(files)}"
        )
