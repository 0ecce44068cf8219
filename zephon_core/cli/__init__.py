"""The ``zephon`` command: look into checkpoints and check your own pipeline.

``zephon inspect PATH``   a state file, a Lightning ``.ckpt`` or an HF ``checkpoint-N/``
``zephon diff A B``       why two checkpoints (or a checkpoint and a pipeline) differ
``zephon explain M:F``    the plan of the pipeline ``F()`` in module ``M``, with a legend
``zephon verify M:F``     cut, restore and compare (``assert_resume_equivalent``)
``zephon bench M:F``      batches/s and tokens/s of your pipeline
``zephon convert IN --out DIR``  JSONL(.zst) shards to Parquet shards

``M:F`` names a module (importable, or a ``.py`` path) and a zero-argument function in
it that returns a ``Pipeline``. Built on ``click`` (install ``zephon[cli]``).
"""

from __future__ import annotations

__all__ = ["main"]


def main() -> None:
    try:
        from .commands import cli
    except ImportError as e:  # click is an optional dependency
        raise SystemExit(f"the zephon command needs click: pip install 'zephon[cli]' ({e})") from e
    cli()
