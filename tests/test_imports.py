"""Imports cost what they use: the CLI's help and reading a state file start without torch,
and every public name is still there (loaded on first use, ``zephon_core/_lazy.py``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import reference_pipeline, worker_env

import zephon_core
import zephon_core.ops
import zephon_core.sources

PROBE = """
import json, sys
from zephon_core.cli import main
sys.argv = ["zephon", *sys.argv[1:]]
try:
    main()
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules,
                  "engine": sorted(m for m in sys.modules if m.startswith("zephon_core.engine."))}))
"""


def _run(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env=worker_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_help_and_inspect_start_without_torch(tmp_path):
    path = tmp_path / "state.zst"
    with reference_pipeline().iterate() as it:
        for _ in range(3):
            next(it)
        it.save(path)
    for args in (["--help"], ["inspect", str(path)]):
        seen = _run(*args)
        assert seen["code"] in (0, None), (args, seen)
        assert not seen["torch"], f"zephon {' '.join(args)} imported torch"
    # reading a state needs no runner: only the mixture report of the engine
    assert seen["engine"] == ["zephon_core.engine.mixture_report"]


@pytest.mark.slow
def test_reading_a_state_file_imports_no_torch(tmp_path):
    code = "import sys, zephon_core.checkpoint.codec; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=worker_env(), capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("package", [zephon_core, zephon_core.ops, zephon_core.sources])
def test_every_public_name_resolves(package):
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    assert set(package.__all__) <= set(dir(package))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        zephon_core.no_such_thing  # noqa: B018
    assert not hasattr(zephon_core.ops, "NoSuchOp")
