"""States written before per-part digests resume after the upgrade (``legacy_content.py``).

The states in ``data/captures-*-03a95f2.state`` were written by main at 03a95f2 for
functions capturing a Namespace, a dict, a dataclass, a user-class instance, a partial
and a module-global dict, and for a dataset of user-class rows (``golden_captures.py``).
This release digests those differently, so they used to be refused, with fixes that
could not work (``version=``).
"""

from __future__ import annotations

import sys

import golden_captures as gc
import pytest
from golden import AFTER, CUT, digest

from zephon_core import IncompatibleCheckpoint, Pipeline, ReplayDivergence
from zephon_core.ops.map import MapOp
from zephon_core.testing import take


def _state(case: str) -> dict:
    return Pipeline.load(gc.DATA / f"{gc.name(case)}.state")


def _this_python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


@pytest.mark.parametrize("case", gc.CASES)
def test_a_state_03a95f2_wrote_resumes_exactly_as_it_continued(case):
    state, recorded = _state(case), gc.recorded(case)
    assert state["version"] == 2 and "parts" not in state["content"]
    with gc.build(case) as pipe:
        if recorded["python"] == _this_python():
            pipe.load_state_dict(state)
        else:  # its byte code differs under this Python, by either release's rules
            with pytest.raises(IncompatibleCheckpoint, match=r"allow_changes=\['functions'\]"):
                pipe.load_state_dict(state)
            pipe.load_state_dict(state, allow_changes={"functions"})
        assert [digest(b) for b in take(pipe, AFTER)] == recorded["after"]
    with gc.build(case) as pipe:  # and this release's uninterrupted run is that stream
        assert [digest(b) for b in take(pipe, CUT + AFTER)[CUT:]] == recorded["after"]


def test_a_changed_function_is_refused_naming_the_release_and_the_way_through(monkeypatch):
    from argparse import Namespace

    other = Namespace(offset=3, max_len=44, min_len=8, resume_from="/tmp/ckpt-1")
    monkeypatch.setattr(gc, "_args", lambda: other)
    state = _state("namespace")
    with pytest.raises(IncompatibleCheckpoint) as e:
        gc.build("namespace").load_state_dict(state)
    msg = str(e.value)
    assert "function of operator 'keep'" in msg and "function of operator 'tokenize'" in msg
    assert "by the digest rules of the release that wrote the state too" in msg
    assert "written by a Zephon release from before states recorded their version" in msg
    assert "allow_changes=['functions']" in msg
    assert "pin it with map(" not in msg  # a pin cannot match a digest made without one
    with gc.build("namespace") as pipe:
        pipe.load_state_dict(state, allow_changes={"functions"})
        assert len(take(pipe, 3)) == 3


def test_changed_rows_of_user_class_objects_are_refused(monkeypatch):
    edited = [{"text": "p0:edited"}, *gc.PROSE[1:]]  # row 0 is always sampled
    monkeypatch.setattr(gc, "PROSE", edited)
    with pytest.raises(IncompatibleCheckpoint) as e:
        gc.build("records").load_state_dict(_state("records"))
    msg = str(e.value)
    assert "dataset 'prose'" in msg and "dataset 'code'" not in msg
    assert "by the digest rules of the release that wrote the state too" in msg


def test_what_the_writing_release_did_not_digest_is_caught_at_replay(monkeypatch):
    """03a95f2 digested a mutable module global by its type alone, so a changed value
    passes the content check as it would have there; the replay value digest sees it."""
    monkeypatch.setitem(gc.GLOBAL_CFG, "offset", 8)
    with gc.build("global") as pipe:
        pipe.load_state_dict(_state("global"))
        with pytest.raises(ReplayDivergence):
            take(pipe, AFTER)


def test_current_states_never_compute_the_old_digest(monkeypatch):
    def old_digest(self):
        raise AssertionError("the old digest was computed for a current state")

    monkeypatch.setattr(MapOp, "legacy_content_fingerprint", old_digest)
    with gc.build("dict") as pipe:
        take(pipe, CUT)
        state = pipe.checkpoint()
    gc.build("dict").load_state_dict(state)
    real = gc._dict_map
    monkeypatch.setattr(gc, "_dict_map", lambda cfg: real({**cfg, "offset": 9}))
    with pytest.raises(IncompatibleCheckpoint, match="closure 'cfg'"):
        gc.build("dict").load_state_dict(state)
