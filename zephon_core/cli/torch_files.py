"""Reading a torch checkpoint (a Lightning ``.ckpt``) without running code from it.

A pickle can call anything it names, so ``zephon inspect`` of a downloaded file must
never unpickle it freely. Files are read with ``torch.load(weights_only=True)`` --
tensors, containers and scalars, what ``trainer.fit(ckpt_path=...)`` itself accepts by
default since torch 2.6 -- plus :data:`DATA_GLOBALS`: plain data types that
hyper-parameters and callback states commonly hold (numpy scalars and arrays, paths,
``argparse.Namespace``, Lightning's ``AttributeDict``, dates). Each one only stores
values; none calls back into user code. The modules of these names are imported only
when a file names them.

A file that names anything else is refused unread (:class:`UntrustedCheckpoint`, naming
the globals); ``trust_pickle=True`` (``--trust-pickle``) loads it with full pickle, for
a file the user wrote.
"""

from __future__ import annotations

import importlib
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

from ..errors import CorruptCheckpoint, UntrustedCheckpoint

#: pickle globals that only carry data (besides torch's own weights_only set)
DATA_GLOBALS = frozenset(
    {
        "numpy.dtype",
        "numpy.ndarray",
        "numpy._core.multiarray.scalar",
        "numpy.core.multiarray.scalar",
        "numpy._core.multiarray._reconstruct",
        "numpy.core.multiarray._reconstruct",
        "pathlib.Path",
        "pathlib.PosixPath",
        "pathlib.WindowsPath",
        "pathlib.PurePosixPath",
        "pathlib.PureWindowsPath",
        "argparse.Namespace",
        "lightning.fabric.utilities.data.AttributeDict",
        "lightning_fabric.utilities.data.AttributeDict",
        "datetime.date",
        "datetime.datetime",
        "datetime.timedelta",
    }
)
_REFUSED = re.compile(r"GLOBAL (\S+) was not an allowed global")


def load_torch_file(path: Path, trust_pickle: bool = False) -> Any:
    """The object in the torch file at ``path``.

    Raises:
        UntrustedCheckpoint: the file names a global outside torch's safe set and
            :data:`DATA_GLOBALS` (and ``trust_pickle`` is False); nothing was run.
        CorruptCheckpoint: not a torch file.
    """
    import torch

    if trust_pickle:
        return _load(path, lambda: torch.load(path, map_location="cpu", weights_only=False))
    if zipfile.is_zipfile(path):  # torch.save's format: its globals are listed without running
        try:
            names = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        except Exception as e:  # noqa: BLE001 - named
            raise CorruptCheckpoint(f"{path} is not a readable torch checkpoint: {e}") from e
        refused = [n for n in names if n not in DATA_GLOBALS]
        if refused:
            raise _untrusted(path, refused)
        try:
            with torch.serialization.safe_globals(_resolve(names)):
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except pickle.UnpicklingError as e:  # an allowed type used in a way torch refuses
            raise _untrusted(path, names, _reason(e)) from None
        except Exception as e:  # noqa: BLE001 - named
            raise CorruptCheckpoint(f"{path} is not a readable torch checkpoint: {e}") from e
    # the legacy format: torch names the first refused global; allow data ones one by one
    allowed: list[str] = []
    while True:
        try:
            with torch.serialization.safe_globals(_resolve(allowed)):
                return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            found = _REFUSED.search(str(e))
            if found is None:
                raise CorruptCheckpoint(f"{path} is not a readable torch checkpoint: {e}") from e
            name = found.group(1)
            if name not in DATA_GLOBALS or name in allowed:
                raise _untrusted(path, [name]) from None
            allowed.append(name)
        except Exception as e:  # noqa: BLE001 - named
            raise CorruptCheckpoint(f"{path} is not a readable torch checkpoint: {e}") from e


def _load(path: Path, load: Any) -> Any:
    try:
        return load()
    except Exception as e:  # noqa: BLE001 - named
        raise CorruptCheckpoint(f"{path} is not a readable torch checkpoint: {e}") from e


def _resolve(names: list[str]) -> list[Any]:
    """The objects of allowed global names (numpy's dtype brings its dtype classes, which
    unpickling builds without naming them)."""
    out = []
    for name in names:
        module, _, attr = name.rpartition(".")
        try:
            out.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):
            continue  # not installed here: torch refuses the file, named as usual
        if name == "numpy.dtype":
            import numpy as np

            out += [t for t in vars(np.dtypes).values() if isinstance(t, type)]
    return out


def _reason(e: Exception) -> str:
    text = str(e).partition("WeightsUnpickler error:")[2] or str(e)
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _untrusted(path: Path, names: list[str], reason: str | None = None) -> UntrustedCheckpoint:
    what = (
        f"torch's safe unpickler refused it ({reason})"
        if reason
        else f"unpickling it would import {', '.join(names[:8])}, which can run code"
    )
    return UntrustedCheckpoint(
        f"{path} was not read: {what}, and Zephon reads checkpoints with "
        "torch.load(weights_only=True) plus plain data types only (trainer.fit(ckpt_path="
        "...) refuses such a file too unless given weights_only=False). If you trust the "
        "file (you wrote it), pass --trust-pickle to load it with full pickle"
    )
