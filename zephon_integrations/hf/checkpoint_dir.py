"""Zephon's file inside a Trainer ``checkpoint-N/`` directory, and finding that directory.

Shared by :class:`ZephonCallback` and :class:`ZephonTrainer`: where the merged state
is written (with ``state_layout="per_rank"``: every rank's own file
``zephon_rank<r>_dp<d>.msgpack.zst`` next to the Trainer's ``rng_state_<r>.pth``, and a
manifest in place of the merged state, ``zephon_core/distributed/rank_files.py``), how
a resume locates it, restoring the Trainer's RNG files (which the Trainer itself
restores too early once ``ignore_data_skip`` is on, see callers), and saying what a
checkpoint lacks for a bit-identical resume (the Trainer only logs that at INFO level,
or not at all).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import random
import secrets
import sys
from typing import Any

import numpy as np
import torch
from transformers.trainer_pt_utils import safe_globals
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from zephon_core import ConfigError, MissingCheckpointState
from zephon_core.checkpoint import codec
from zephon_core.checkpoint.trainer_files import HF_STATE_FILE
from zephon_core.distributed import rank_files
from zephon_core.distributed.topology import Topology
from zephon_core.errors import CheckpointError

STATE_FILE = HF_STATE_FILE
log = logging.getLogger(__name__)


def step_dir(output_dir: str, global_step: int) -> str:
    return os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{global_step}")


def write_state(checkpoint_dir: str, state: dict[str, Any]) -> str:
    """Write ``state`` into ``checkpoint_dir`` atomically (a reader never sees half a file)."""
    _check_dir(checkpoint_dir)
    path = os.path.join(checkpoint_dir, STATE_FILE)
    codec.write_atomic(path, codec.encode(state))
    return path


def _check_dir(checkpoint_dir: str) -> None:
    if not os.path.isdir(checkpoint_dir):
        raise ConfigError(
            f"{checkpoint_dir} does not exist; the Trainer saves elsewhere "
            "(hyperparameter search?) and Zephon cannot place its state"
        )


def save_nonce() -> str:
    """A token naming one ``train()``'s saves, the same on every rank (one broadcast per
    ``train()`` when torch.distributed runs; none per save)."""
    token = secrets.token_hex(6)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [token]
        dist.broadcast_object_list(box, src=0)
        token = box[0]
    return token


def write_share(
    checkpoint_dir: str,
    state: dict[str, Any],
    *,
    save_id: str,
    topology: Topology,
    with_manifest: bool,
) -> None:
    """``state_layout="per_rank"``: write this rank's per-rank ``state`` into its own file
    in ``checkpoint_dir``; ``with_manifest`` (the rank that saves): the manifest too, as
    the state file. Every rank writes, none waits for another."""
    _check_dir(checkpoint_dir)
    rank_files.write_rank_file(checkpoint_dir, save_id=save_id, topology=topology, state=state)
    if with_manifest:
        m = rank_files.manifest(
            save_id=save_id,
            state=state,
            topology=topology,
            files="",  # beside the manifest, in checkpoint-N/
            files_abs=os.path.abspath(checkpoint_dir),
        )
        codec.write_atomic(os.path.join(checkpoint_dir, STATE_FILE), codec.encode(m))


def read_state(checkpoint_dir: str, topology: Topology | None = None) -> dict[str, Any]:
    """The Zephon state saved in ``checkpoint_dir``: the merged state, or -- a checkpoint
    saved with ``state_layout="per_rank"`` -- the share of the rank at ``topology`` (every
    rank raises alike if any cannot read its share).

    Raises:
        MissingCheckpointState: the directory has no state file. Zephon writes its file
            after the Trainer's, so when sibling checkpoints have one, this save was most
            likely interrupted: the error names the latest complete checkpoint.
    """
    path = os.path.join(checkpoint_dir, STATE_FILE)
    if not os.path.exists(path):
        complete = _complete_siblings(checkpoint_dir)
        if complete:
            raise MissingCheckpointState(
                f"{checkpoint_dir} has no {STATE_FILE}: the save was probably interrupted "
                f"(Zephon writes its file after the Trainer's). Resume from {complete[-1]}, "
                "the latest complete checkpoint, and delete the incomplete one"
            )
        raise MissingCheckpointState(
            f"{checkpoint_dir} has no {STATE_FILE}: it was not written with "
            "ZephonCallback/ZephonTrainer (or its save was interrupted), so the data "
            "position cannot be restored"
        )
    state = codec.decode(codec.read_bytes(path))
    if not rank_files.is_manifest(state):
        return state
    share, error = None, None
    try:
        directory = rank_files.locate(state, checkpoint_dir)
        share = rank_files.read_share(state, directory, topology or Topology())
    except (CheckpointError, OSError) as e:
        error = e
    rank_files.agree(error)
    return share.state


def _complete_siblings(checkpoint_dir: str) -> list[str]:
    """``checkpoint-N`` directories next to ``checkpoint_dir`` with a state file, by step,
    older than it."""
    parent = os.path.dirname(os.path.abspath(checkpoint_dir))
    own = _step_of(os.path.basename(os.path.abspath(checkpoint_dir)))
    found = []
    for name in os.listdir(parent) if os.path.isdir(parent) else []:
        step = _step_of(name)
        full = os.path.join(parent, name)
        if (
            step is not None
            and (own is None or step < own)
            and os.path.isfile(os.path.join(full, STATE_FILE))
        ):
            found.append((step, full))
    return [p for _, p in sorted(found)]


def _step_of(name: str) -> int | None:
    prefix = f"{PREFIX_CHECKPOINT_DIR}-"
    tail = name[len(prefix) :] if name.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def trainer_resume_arg() -> str | None:
    """The checkpoint the running ``Trainer.train()`` resumes from, if any.

    Callbacks are not told the path (``train(resume_from_checkpoint=...)`` is not in
    ``args``), so read it from the Trainer's training-loop frame, where ``True`` has
    already been resolved to the last ``checkpoint-*`` of ``output_dir``.
    """
    from transformers import Trainer

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_inner_training_loop" and isinstance(
            frame.f_locals.get("self"), Trainer
        ):
            path = frame.f_locals.get("resume_from_checkpoint")
            return path if isinstance(path, (str, os.PathLike)) else None
        frame = frame.f_back
    return None


def last_checkpoint(output_dir: str) -> str:
    """The latest ``checkpoint-N`` of ``output_dir``, for ``resume_from_checkpoint=True``.

    Raises:
        ConfigError: there is none -- also where ``output_dir`` does not exist, as on a
            rank other than 0 (only rank 0 creates it), so every rank fails alike.
    """
    found = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    if found is None:
        raise ConfigError(
            f"resume_from_checkpoint=True but {output_dir} holds no checkpoint-* "
            "directory (on this rank): start without resume_from_checkpoint, or pass "
            "the checkpoint's path"
        )
    return found


def resolve_resume_dir(output_dir: str, global_step: int, explicit: str | None) -> str:
    """The directory a resume at ``global_step`` restores from.

    Order: an explicit path; the path the Trainer was given; ``checkpoint-<step>`` of
    ``output_dir``. The directory's ``trainer_state.json`` must be at the same step.
    """
    path = explicit or trainer_resume_arg() or step_dir(output_dir, global_step)
    path = os.fspath(path)
    trainer_state = os.path.join(path, "trainer_state.json")
    if os.path.exists(trainer_state):
        with open(trainer_state) as f:
            saved_step = json.load(f).get("global_step")
        if saved_step != global_step:
            raise ConfigError(
                f"{path} was saved at step {saved_step} but the Trainer resumes "
                f"at step {global_step}; pass the checkpoint the Trainer resumes "
                "from (ZephonCallback(resume_from=...))"
            )
    return path


def restore_rng(checkpoint_dir: str, process_index: int, world_size: int) -> bool:
    """Set python/numpy/torch (and CUDA) RNGs from the Trainer's ``rng_state*.pth``."""
    name = f"rng_state_{process_index}.pth" if world_size > 1 else "rng_state.pth"
    path = os.path.join(checkpoint_dir, name)
    if not os.path.isfile(path):
        return False
    with safe_globals():  # the Trainer's own loader settings: numpy RNG state, no code
        state = torch.load(path, weights_only=True)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["cpu"])
    if torch.cuda.is_available() and "cuda" in state:
        cuda = state["cuda"]
        if isinstance(cuda, (list, tuple)):
            torch.cuda.set_rng_state_all(cuda)
        else:
            torch.cuda.set_rng_state(cuda)
    return True


def warn_resume_gaps(
    checkpoint_dir: str, process_index: int, world_size: int, who: str, deepspeed: bool = False
) -> list[str]:
    """Log one WARNING when ``checkpoint_dir`` lacks what the Trainer needs to continue the
    model's run bit for bit; returns what is missing (empty: nothing).

    Zephon's own state continues the data exactly either way. The Trainer resumes
    without complaint (or with an INFO line) when the RNG file of this process is absent
    (``save_only_model=True``, or another number of processes saved it) or when the
    optimizer/scheduler files are (``save_only_model=True``).
    """
    gaps = []
    rng = f"rng_state_{process_index}.pth" if world_size > 1 else "rng_state.pth"
    if not os.path.isfile(os.path.join(checkpoint_dir, rng)):
        pattern = os.path.join(glob.escape(checkpoint_dir), "rng_state*.pth")
        others = sorted(os.path.basename(p) for p in glob.glob(pattern))
        why = (
            f"it holds {', '.join(others)}: saved by another number of processes than "
            f"the {world_size} resuming"
            if others
            else "saved with save_only_model=True?"
        )
        gaps.append(
            f"it has no {rng} for process {process_index} ({why}), so dropout and every "
            "other random draw of the model differ from the uninterrupted run"
        )
    if not deepspeed and not _has_optimizer(checkpoint_dir):
        gaps.append(
            "it has no optimizer/scheduler state (optimizer.pt and scheduler.pt: saved "
            "with save_only_model=True?), so the optimizer and the learning-rate schedule "
            "start afresh"
        )
    if gaps:
        log.warning(
            "%s: resuming from %s, the data continues exactly, but %s. Losses will "
            "not match an uninterrupted run",
            who,
            checkpoint_dir,
            "; and ".join(gaps),
        )
    return gaps


def _has_optimizer(checkpoint_dir: str) -> bool:
    # the Trainer's own test (_load_optimizer_and_scheduler): it loads neither without both
    names = os.listdir(checkpoint_dir) if os.path.isdir(checkpoint_dir) else []
    optimizer = any(
        n in ("optimizer.pt", "optimizer.bin")
        or ("optimizer" in n and os.path.isdir(os.path.join(checkpoint_dir, n)))
        for n in names
    )
    return optimizer and "scheduler.pt" in names
