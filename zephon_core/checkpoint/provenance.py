"""Which Zephon wrote a state, and what a refusal says when it was another one.
(``docs/design.md`` §8)

A state records the release that wrote it (``zephon_version``, schema version 3 on).
When a restore refuses a state because the configuration differs and another release
wrote it, the difference may come from the release, not from the user's pipeline: a
newer Zephon describes operators with options the older one did not have (they show as
"absent in checkpoint"). "Rebuild the pipeline exactly as it was" cannot help then, so
the refusal says which release wrote the state, that this one cannot resume it, and
how to finish the run. States written before versions were recorded say so.

Example::

    >>> writer(None, 2)
    'a Zephon release from before states recorded their version (state schema 2)'
"""

from __future__ import annotations

from collections.abc import Sequence

from .._version import __version__


def writer(written_by: str | None, schema: int | None = None) -> str:
    """Who wrote a state, for messages."""
    schema_text = f" (state schema {schema})" if schema is not None else ""
    if written_by is None:
        return f"a Zephon release from before states recorded their version{schema_text}"
    return f"Zephon {written_by}{schema_text}"


def version_note(written_by: str | None, diff: Sequence[str], schema: int | None = None) -> str:
    """A sentence for a configuration refusal of a state another release wrote ("" when
    this release wrote it: then the user's pipeline changed, not Zephon)."""
    if written_by == __version__:
        return ""
    absent = [line.split(":", 1)[0] for line in diff if ": absent in checkpoint" in line]
    added = (
        f" (options absent in checkpoint -- {', '.join(absent[:6])} -- are ones this "
        "release describes and that one did not)"
        if absent
        else ""
    )
    how = (
        f"finish the run with Zephon {written_by} (pip install 'zephon=={written_by}')"
        if written_by is not None
        else "finish the run with the Zephon release that wrote it"
    )
    return (
        f" The state was written by {writer(written_by, schema)}; this is Zephon "
        f"{__version__}. If the pipeline is built exactly as it was, the difference comes "
        f"from the release{added}, and this release cannot resume that state: {how}, or "
        "start a new run."
    )
