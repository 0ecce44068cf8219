"""Run every benchmark and print the numbers (JSON)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import bench_core  # noqa: E402
import bench_distributed  # noqa: E402
import bench_hf  # noqa: E402
import bench_hf_trainer  # noqa: E402
import bench_mixture  # noqa: E402
import bench_parquet  # noqa: E402
import bench_provenance  # noqa: E402
import bench_runners  # noqa: E402
import bench_throughput  # noqa: E402
import bench_vs_grain  # noqa: E402

if __name__ == "__main__":
    print(
        json.dumps(
            {
                "vs_grain": bench_vs_grain.main(),
                "core": bench_core.main(),
                "distributed": bench_distributed.main(),
                "hf_fetch": bench_hf.main(),
                "hf_trainer_data_path": bench_hf_trainer.main(),
                "runners_gil_bound_map": bench_runners.main(),
                "mixture_token_share": bench_mixture.main(),
                "throughput_real_tokenizer": bench_throughput.main(),
                "provenance_overhead": bench_provenance.main(),
                "parquet_s3": bench_parquet.main(),
            },
            indent=2,
        )
    )
