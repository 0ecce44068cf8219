"""States name the Zephon that wrote them; a refusal of another release's state says so.

``checkpoint/provenance.py``: a state of an earlier release used to be refused with
"rebuild the pipeline exactly as it was" and options "absent in checkpoint", which no
rebuild can fix. The files in ``data/`` were written by earlier releases (``golden.py``).
"""

from __future__ import annotations

import copy
import json

import golden
import pytest

from zephon_core import IncompatibleCheckpoint, Pipeline, __version__
from zephon_core.checkpoint.state import READS, VERSION, PipelineState
from zephon_core.digests.fingerprint import fingerprint
from zephon_core.testing import take


def _after(name: str) -> list[str]:
    return json.loads((golden.DATA / f"{name}.json").read_text())["after"]


def test_a_state_main_wrote_resumes_exactly_as_main_continued():
    state = Pipeline.load(golden.DATA / "main-03a95f2.state")
    assert state["version"] == 2 and "zephon_version" not in state
    with golden.build() as pipe:
        pipe.load_state_dict(state)
        assert [golden.digest(b) for b in take(pipe, golden.AFTER)] == _after("main-03a95f2")
    # and this release's own uninterrupted run is the same stream
    with golden.build() as pipe:
        out = take(pipe, golden.CUT + golden.AFTER)[golden.CUT :]
        assert [golden.digest(b) for b in out] == _after("main-03a95f2")


def test_a_state_of_an_earlier_release_is_refused_naming_the_release():
    """Written by the commit before 9e697b7, whose batch() did not describe its
    attention, mask_dtype and flash_kwargs options."""
    state = Pipeline.load(golden.DATA / "pre-9e697b7.state")
    with pytest.raises(IncompatibleCheckpoint) as e:
        golden.build().load_state_dict(state)
    msg = str(e.value)
    assert "flash_kwargs: absent in checkpoint" in msg  # what differs, as before
    assert "written by a Zephon release from before states recorded their version" in msg
    assert f"this is Zephon {__version__}" in msg
    assert "this release cannot resume that state" in msg
    assert "finish the run with the Zephon release that wrote it" in msg


def _other_release(state: dict, release: str) -> dict:
    """``state`` as ``release`` would have written it, had it not described flash_kwargs."""
    old = copy.deepcopy(state)
    old["zephon_version"] = release
    del old["config"]["ops"][-1]["flash_kwargs"]
    old["fingerprint"] = fingerprint(old["config"])
    return old


@pytest.fixture(scope="module")
def state() -> dict:
    with golden.build() as pipe:
        take(pipe, golden.CUT)
        return pipe.checkpoint()


def test_states_record_the_release_and_schema_that_wrote_them(state):
    assert state["zephon_version"] == __version__ and state["version"] == VERSION == 3


def test_a_versioned_state_of_another_release_names_it_and_how_to_finish(state):
    with pytest.raises(IncompatibleCheckpoint) as e:
        golden.build().load_state_dict(_other_release(state, "0.0.9"))
    msg = str(e.value)
    assert "written by Zephon 0.0.9" in msg and "pip install 'zephon==0.0.9'" in msg
    assert "options absent in checkpoint -- ops[5].flash_kwargs --" in msg


def test_a_change_of_the_users_own_pipeline_says_nothing_about_releases(state):
    with pytest.raises(IncompatibleCheckpoint) as e:
        golden.build().load_state_dict(_other_release(state, __version__))
    assert "Rebuild the pipeline exactly" in str(e.value)
    assert "The state was written by" not in str(e.value)


def test_a_newer_schema_names_the_release_that_wrote_it(state):
    newer = copy.deepcopy(state)
    newer["version"], newer["zephon_version"] = READS[-1] + 1, "9.0.0"
    with pytest.raises(IncompatibleCheckpoint) as e:
        golden.build().load_state_dict(newer)
    msg = str(e.value)
    assert f"schema version {READS[-1] + 1} (written by Zephon 9.0.0)" in msg
    assert f"this Zephon ({__version__}) reads versions 1 to {READS[-1]}" in msg


def test_every_reader_sees_the_previous_releases_configuration_migrated(state):
    """main at 03a95f2 named map functions by module (``ops[1].fn``); from_dict reads the
    state without them, so a restore, the CLI and a merge see this release's config."""
    raw = Pipeline.load(golden.DATA / "main-03a95f2.state")
    assert raw["config"]["ops"][1]["fn"] == "golden.tokenize"
    parsed = PipelineState.from_dict(raw)
    assert "fn" not in parsed.config["ops"][1]
    assert parsed.fingerprint == state["fingerprint"] == fingerprint(parsed.config)
