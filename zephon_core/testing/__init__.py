"""Test helpers users call on their own pipelines and operators."""

from .ranks import SimulatedRanks
from .resume import (
    ResumeMismatch,
    ResumeReport,
    assert_resume_equivalent,
    assert_streams_equal,
    first_difference,
    reseed_globals,
    take,
)

__all__ = [
    "SimulatedRanks",
    "assert_resume_equivalent",
    "assert_streams_equal",
    "first_difference",
    "reseed_globals",
    "take",
    "ResumeMismatch",
    "ResumeReport",
]
