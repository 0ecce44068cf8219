"""Child-process side of tests/distributed/test_aggregation.py.

Run as ``python agg_worker.py <spec.json>``. One process plays one rank: it
builds the reference pipeline with the requested aggregation settings, takes
outputs, calls ``checkpoint()`` once per round and writes everything it saw
(outputs, merged states or the error, timings, the coordination directory
as the leader saw it) to ``spec["out"]`` as a pickle. Faults are injected by
name (``spec["faults"]``) with monkeypatches applied inside this process only.

Synchronisation with the other ranks only goes through files in
``spec["sync"]`` (barriers) -- never through sleeps.

Times: a round's budget starts inside ``Aggregator.round`` (it computes its deadline on
entry), not when ``checkpoint()`` is called (which first gathers this rank's state and
may open the storage: seconds on a loaded machine). Each round's entry records
``round_start``/``round_end`` and ``round_s`` (their difference: what the budget
bounds) on ``time.monotonic()``, which on Linux is one clock for every process, so the
test can compare the ranks' timelines; ``put_times`` records when each storage write
finished. ``rnd["budget"]`` sets that round's ``aggregate_timeout_s`` (a short one
where the test waits one out, a generous one where the round must succeed). Progress
goes to stdout and, past ``spec["deadline_s"]``, every thread's stack to stderr: a
test's hang guard shows both.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import pickle
import signal
import sys
import time
import traceback
from pathlib import Path


def build(*, aggregate_dir=None, aggregate_store=None, aggregate_timeout_s: float = 300.0):
    """The pipeline of ``helpers.reference_pipeline()`` with aggregation settings."""
    from helpers import byte_tokenize, source

    from zephon_core import Pipeline

    return (
        Pipeline(
            source(8),
            canonical_replicas=4,
            flush_every_k_chunks=2,
            seed=11,
            prefetch=3,
            aggregate_dir=aggregate_dir,
            aggregate_store=aggregate_store,
            aggregate_timeout_s=aggregate_timeout_s,
        )
        .fetch(parallelism=2)
        .map(byte_tokenize, parallelism=2, name="tokenize")
        .split(max_len=128)
        .pack(seq_len=128, bins=4)
        .shuffle(buffer_size=16)
        .ensure_mixture(window=8)
        .batch(batch_size=4)
    )


# -- file synchronisation ------------------------------------------------------------
class SyncTimeout(RuntimeError):
    pass


def wait_files(paths, deadline: float, what: str) -> None:
    """Block until every path exists (polling the filesystem), or raise at ``deadline``."""
    paths = [Path(p) for p in paths]
    while True:
        if all(p.exists() for p in paths):
            return
        if time.monotonic() > deadline:
            missing = [str(p) for p in paths if not p.exists()]
            raise SyncTimeout(f"{what}: still missing {missing}")
        time.sleep(0.005)


def touch(path) -> None:
    tmp = Path(f"{path}.part{os.getpid()}")
    tmp.write_bytes(b"1")
    os.replace(tmp, path)


def barrier(sync: Path, name: str, tag: str, tags, deadline: float) -> None:
    touch(sync / f"{name}.{tag}")
    wait_files([sync / f"{name}.{t}" for t in tags], deadline, f"barrier {name}")


# -- faults ---------------------------------------------------------------------------
def apply_faults(spec: dict, log: dict) -> None:
    from zephon_core import PipelineIterator
    from zephon_core.distributed import aggregate, storage

    faults = spec.get("faults", [])
    sync = Path(spec["sync"])

    if "merge_raises" in faults:  # the leader fails after collecting, before publishing

        def boom(*a, **k):
            raise RuntimeError("injected merge failure in the leader")

        aggregate.merge_reports = boom

    if "kill_after_state_write" in faults:  # SIGKILL right after this rank's state is stored
        kill_round = spec.get("kill_round", 1)  # ... in this round (1: the first)
        for cls in (storage.DirStorage, storage.StoreStorage):
            orig_put = cls.put

            def put(self, key, value, *args, _orig=orig_put):
                _orig(self, key, value, *args)
                if ".state." in key:
                    log["states_written"] = log.get("states_written", 0) + 1
                    if log["states_written"] == kill_round:
                        os.kill(os.getpid(), signal.SIGKILL)

            cls.put = put

    if "signal_first_announce_poll" in faults:  # tell others once we looked for a round
        orig_get = storage.DirStorage.get

        def get(self, key, *args, _orig=orig_get):
            value = _orig(self, key, *args)
            if key == "announce" and not log.get("announce_polled"):
                log["announce_polled"] = True
                touch(sync / f"announce_polled.{spec['tag']}")
            return value

        storage.DirStorage.get = get

    if "signal_announce_read" in faults:  # tell others once we know the round id
        orig_get2 = storage.DirStorage.get

        def get2(self, key, *args, _orig=orig_get2):
            value = _orig(self, key, *args)
            if key == "announce" and value is not None and not log.get("announce_read"):
                log["announce_read"] = True
                touch(sync / f"announce_read.{spec['tag']}")
            return value

        storage.DirStorage.get = get2

    if "diverge_cursor" in faults:  # a model-parallel peer reports a different cursor
        orig_local = PipelineIterator._local_state

        def local_state(self, served=None, _orig=orig_local):
            st = _orig(self, served)
            lane = min(st.lanes)
            c = st.lanes[lane].cursor
            st.lanes[lane].cursor = c._replace(offset=c.offset + 1)
            log["diverged_lane"] = lane
            return st

        PipelineIterator._local_state = local_state

    if "drop_last_lane" in faults:  # a rank reports only part of its DP group's lanes
        orig_local2 = PipelineIterator._local_state

        def local_state2(self, served=None, _orig=orig_local2):
            st = _orig(self, served)
            dropped = max(st.lanes)
            del st.lanes[dropped]
            log["dropped_lane"] = dropped
            return st

        PipelineIterator._local_state = local_state2

    # keys the storage saw written (so the leader can check a torch Store for leftovers),
    # when each write finished, and files to touch once a key was written
    signals = spec.get("signal_puts", {})  # {key or key suffix: sync file name}
    for cls in (storage.DirStorage, storage.StoreStorage):
        orig = cls.put

        def put_logged(self, key, value, *args, _orig=orig):
            log.setdefault("put_keys", []).append(key)
            _orig(self, key, value, *args)
            log.setdefault("put_times", []).append((key, time.monotonic()))
            for suffix, name in signals.items():  # the n-th such write touches name.n
                if value and key.endswith(suffix):
                    n = sum(k.endswith(suffix) for k, _ in log["put_times"])
                    touch(sync / f"{name}.{n}")

        cls.put = put_logged


def instrument_rounds(current: dict) -> None:
    """Record when each round's budget starts, and apply the round's own budget."""
    from zephon_core.distributed.aggregate import Aggregator

    orig_round = Aggregator.round

    def timed_round(self, local, _orig=orig_round):
        self.timeout_s = current["budget"]
        current["round_start"] = time.monotonic()
        return _orig(self, local)

    Aggregator.round = timed_round


def progress(spec: dict, what: str) -> None:
    print(f"{time.monotonic():.3f} {spec['tag']}: {what}", flush=True)


def install_disk_full_standin(capacity: int) -> None:
    """A ``diskfull://`` file system: the local one, whose writes fail with ENOSPC once
    the directory's files would take more than ``capacity`` bytes in 4 KiB pages, as on a
    tmpfs of that size. Only a stand-in for the disk where no tiny tmpfs can be mounted
    (``test_aggregation_disk_full.py`` says which one ran): what is tested is Zephon's
    handling of ENOSPC, not the file system."""
    import errno
    import math

    import fsspec
    from fsspec.implementations.local import LocalFileOpener, LocalFileSystem

    page = 4096

    class Capped(LocalFileOpener):
        def write(self, data):
            d = os.path.dirname(self.path)
            used = sum(
                math.ceil(os.path.getsize(os.path.join(d, n)) / page)
                for n in os.listdir(d)
                if os.path.join(d, n) != self.path
            )
            if (used + math.ceil((self.f.tell() + len(data)) / page)) * page > capacity:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
            return super().write(data)

    class DiskFull(LocalFileSystem):
        protocol = "diskfull"

        def _open(self, path, mode="rb", block_size=None, **kwargs):
            path = self._strip_protocol(path)
            return Capped(path, mode, fs=self, **kwargs)

    fsspec.register_implementation("diskfull", DiskFull, clobber=True)


# -- storage inspection ---------------------------------------------------------------
def _store(store):
    if store is not None:
        return store
    from torch.distributed.distributed_c10d import _get_default_store

    return _get_default_store()


def _rids(log: dict) -> list[str]:
    """Round ids this (leader) process announced."""
    rids = []
    for k in log.get("put_keys", []):
        if k.endswith(".state.0"):
            rids.append(k[: -len(".state.0")])
    return rids


def store_live_keys(store, rids, world: int) -> list[str]:
    """Which protocol keys of the given rounds still exist in a torch Store."""
    keys = ["announce"]
    for rid in rids:
        keys += [f"{rid}.merged"] + [f"{rid}.state.{r}" for r in range(world)]
        keys += [f"{rid}.ack.{r}" for r in range(world)]
    return [k for k in keys if store.check(["zephon/" + k])]


def dir_snapshot(d) -> dict[str, bytes]:
    """Every file of the coordination directory with its bytes (they are small)."""
    snap = {}
    d = str(d).removeprefix("diskfull://")  # the stand-in for a full disk is a local dir
    if not os.path.isdir(d):  # nobody opened the storage yet
        return snap
    for name in sorted(os.listdir(d)):
        try:
            snap[name] = Path(d, name).read_bytes()
        except FileNotFoundError:  # deleted meanwhile by another rank
            pass
    return snap


# -- main -----------------------------------------------------------------------------
def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    deadline = time.monotonic() + spec.get("deadline_s", 60)
    faulthandler.dump_traceback_later(spec.get("deadline_s", 60), file=sys.stderr)
    progress(spec, "started")
    sync = Path(spec["sync"])
    out = Path(spec["out"])
    rank, world = spec["rank"], spec["world"]
    log: dict = {"tag": spec["tag"], "rank": rank, "rounds": [], "outputs": []}
    pipe = None
    store = None
    try:
        import torch.distributed as dist

        from zephon_core import Pipeline

        backend = spec["backend"]
        kwargs = {"aggregate_timeout_s": spec["timeout"]}
        if spec.get("init_pg"):
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=rank, world_size=world
            )
        if backend == "dir":
            kwargs["aggregate_dir"] = spec["agg_dir"]
        elif backend == "torch":
            kwargs["aggregate_store"] = "torch://"
        elif backend == "default":
            pass  # no aggregate_* argument: "torch://" because torch.distributed is initialized
        elif backend == "tcpstore":
            import datetime

            wait = datetime.timedelta(seconds=spec.get("deadline_s", 60))  # rank 0 may start late
            store = dist.TCPStore("127.0.0.1", spec["port"], world, rank == 0, wait)
            kwargs["aggregate_store"] = store
        elif backend == "filestore":
            store = dist.FileStore(spec["filestore"], world)
            kwargs["aggregate_store"] = store
        else:
            raise ValueError(backend)

        apply_faults(spec, log)
        current: dict = {}
        instrument_rounds(current)
        if spec.get("disk_capacity") is not None:
            install_disk_full_standin(spec["disk_capacity"])
        if spec.get("agg_dir"):
            # connect before the rounds: the first use of a file system (an object store
            # client loads botocore's models) takes seconds on a loaded machine; fsspec
            # hands the aggregation the same cached file system
            import fsspec

            fs, root = fsspec.core.url_to_fs(spec["agg_dir"])
            fs.exists(root)
        pipe = build(**kwargs)
        if spec.get("bind"):
            pipe = pipe.bind(**spec["bind"])
        if spec.get("restore"):
            pipe.load_state_dict(Pipeline.load(spec["restore"]))
        it = iter(pipe)
        progress(spec, "pipeline built")
        for i, rnd in enumerate(spec["rounds"], 1):
            outs = [next(it) for _ in range(rnd["take"])]
            log["outputs"].append(outs)
            if rnd.get("declare"):  # from now on claim another place in the topology
                from zephon_core.distributed import Topology

                declared = Topology(**rnd["declare"])
                it.spec = dataclasses.replace(it.spec, topology=declared)
            if rnd.get("barrier"):
                progress(spec, f"round {i}: barrier {rnd['barrier']}")
                barrier(sync, rnd["barrier"], spec["tag"], rnd["barrier_tags"], deadline)
            if rnd.get("wait_files"):
                progress(spec, f"round {i}: waiting for {rnd['wait_files']}")
                wait_files([sync / f for f in rnd["wait_files"]], deadline, "wait_files")
            entry: dict = {"called": not rnd.get("skip")}
            if not rnd.get("skip"):
                progress(spec, f"round {i}: checkpoint()")
                current.clear()
                current["budget"] = rnd.get("budget", spec["timeout"])
                try:
                    entry["state"] = pipe.checkpoint()
                    entry["ok"] = True
                except BaseException as e:  # noqa: BLE001 - reported to the test
                    entry.update(
                        ok=False,
                        error_type=type(e).__name__,
                        error_mro=[c.__name__ for c in type(e).__mro__],
                        error=str(e),
                        tb=traceback.format_exc(),
                    )
                entry["round_end"] = time.monotonic()
                entry["round_start"] = current.get("round_start")  # None: no round began
                entry["budget"] = current.get("budget")
                if entry["round_start"] is not None:
                    entry["round_s"] = entry["round_end"] - entry["round_start"]
                progress(spec, f"round {i}: {'ok' if entry['ok'] else entry['error_type']}")
                if backend == "dir":
                    entry["dir_after"] = dir_snapshot(spec["agg_dir"])
                elif rank == 0:
                    entry["store_live"] = store_live_keys(_store(store), _rids(log), world)
            log["rounds"].append(entry)
            if rnd.get("signal_after"):
                touch(sync / rnd["signal_after"])
        pipe.close()
        if backend == "dir":
            log["dir_after_close"] = dir_snapshot(spec["agg_dir"])
        elif rank == 0:
            log["store_live_after_close"] = store_live_keys(_store(store), _rids(log), world)
    except BaseException:  # noqa: BLE001
        log["crash"] = traceback.format_exc()
    finally:
        tmp = out.with_suffix(".part")
        with open(tmp, "wb") as f:
            pickle.dump(log, f)
        os.replace(tmp, out)
    progress(spec, "log written")
    # keep a store server (rank 0) alive until every surviving rank is done with it
    if spec.get("exit_tags"):
        try:
            barrier(sync, "exit", spec["tag"], spec["exit_tags"], deadline)
        except SyncTimeout:
            pass
    if spec.get("init_pg"):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
