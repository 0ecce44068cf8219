"""The ``zephon`` command: look into checkpoints and check your own pipeline.

``zephon inspect PATH``   a state file, a Lightning ``.ckpt`` or an HF ``checkpoint-N/``
``zephon diff A B``       whether B (a checkpoint or a pipeline) accepts checkpoint A, and
                          why not; ``--allow-changes weights,...`` as ``load_state_dict``
``zephon explain M:F``    the plan of the pipeline ``F()`` in module ``M``, with a legend
``zephon verify M:F``     cut, restore and compare (``assert_resume_equivalent``)
``zephon bench M:F``      batches/s and tokens/s of your pipeline
``zephon convert IN --out DIR``  JSONL(.zst) shards to Parquet shards
``zephon trace CKPT M:F --step N``  what the model saw at step N: restore, replay, and
                          describe every row's documents (``trace.py``)

``M:F`` names a module (importable, or a ``.py`` path) and a zero-argument function in
it that returns a ``Pipeline``. Built on ``click`` (install ``zephon[cli]``).

Checkpoints are read as a restore reads them: the same checks (a state the restore would
refuse is an error, exit code 1), and a ``.ckpt`` without running code from it
(``torch_files.py``; ``--trust-pickle`` for a file you wrote).
"""

from __future__ import annotations

__all__ = ["main"]


def main() -> None:
    try:
        from .commands import cli
    except ImportError as e:  # click is an optional dependency
        raise SystemExit(f"the zephon command needs click: pip install 'zephon[cli]' ({e})") from e
    cli(prog_name="zephon")  # also as ``python -m zephon_core.cli``
