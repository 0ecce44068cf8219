"""What ``zephon diff`` says: whether one state restores where another was taken, and
what a restore with ``allow_changes`` would do.

Between two checkpoints there is no pipeline, so the comparison is the restore's own
first steps on the two configurations and content digests (``checkpoint/remix.py``
``classify_diff``: mixture, datasets added or removed, datasets of another length, the
rest; ``checkpoint/restore.py`` ``content_changes``). The re-mix itself
(cursors translated per dataset, inflight chunks renumbered) needs the pipeline: ``zephon
diff STATE module:function --allow-changes ...`` runs the restore's admission in full.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..checkpoint.legacy_content import is_legacy
from ..checkpoint.provenance import writer
from ..checkpoint.remix import REMIX_CHANGES, classify_diff
from ..checkpoint.resize import resized
from ..checkpoint.restore import content_changes
from ..checkpoint.state import PipelineState
from ..digests.fingerprint import config_diff


def compare_states(
    a: PipelineState, b: PipelineState, allowed: Sequence[str] = ()
) -> tuple[bool, list[str]]:
    """(whether a pipeline configured as ``b`` accepts ``a`` under ``allowed``, the lines
    that say why or what the restore would change)."""
    other, mix, comp, lengths = classify_diff(a.config, b.config, _source_type(b.config))
    changes = content_changes(a.content or {}, b.content or {})
    refused = list(other)
    if lengths and "data" not in allowed:
        refused += lengths  # datasets of another length: a data change (resize.py)
    if comp and "components" not in allowed:
        refused += comp  # the rule remix() applies
    if mix and not set(allowed) & REMIX_CHANGES:
        refused += mix
    for kind in ("data", "functions"):
        if kind not in allowed:
            refused += changes[kind]
    writers = (
        [f"A was written by {writer(a.written_by)}, B by {writer(b.written_by)}"]
        if a.written_by != b.written_by
        else []
    )
    if refused:
        hint = []
        if not other and not lengths and (mix or comp):
            needed = ["weights"] + (["components"] if comp else [])
            hint = [f"(only the mixture differs: --allow-changes {','.join(needed)} re-mixes)"]
        if lengths and "data" not in allowed:
            hint.append(
                "(datasets changed length: their data changed; --allow-changes data "
                "continues over the new rows)"
            )
        if a.content is not None and is_legacy(a.content) and any(changes.values()):
            hint.append(
                "(A was written before per-part digests, by rules this release recomputes "
                "from the pipeline only: zephon diff A module:function decides whether its "
                "functions and datasets changed)"
            )
        return False, refused + writers + hint
    if not (config_diff(a.config, b.config) or changes["data"] or changes["functions"]):
        return True, ["same configuration and content: B restores A's state exactly", *writers]
    return True, [
        f"a pipeline configured as B accepts A with allow_changes={sorted(allowed)}:",
        *("  " + line for line in remix_lines(a, b.config, None, b.content or {}, allowed)),
        "(the re-mix itself needs the pipeline: zephon diff A module:function "
        f"--allow-changes {','.join(sorted(allowed))} runs the restore's admission)",
        *writers,
    ]


def remix_lines(
    a: PipelineState,
    config: dict[str, Any],
    source: Any,
    content: dict[str, Any],
    allowed: Sequence[str],
) -> list[str]:
    """What restoring ``a`` into a pipeline of ``config`` / ``content`` changes."""
    _, mix, comp, _ = classify_diff(a.config, config, source or _source_type(config))
    lines: list[str] = []
    if mix or comp:
        lines += _shares(a.config.get("source") or {}, config.get("source") or {})
        lines += [line for line in mix if not line.startswith("source.weights")]
        inflight = sum(len(ls.chunks) for ls in a.lanes.values())
        lines.append(
            "every dataset keeps its position and epochs, a new one starts at its beginning; "
            f"the {inflight} inflight chunks replay as written (nothing delivered comes "
            "again, nothing is skipped); later chunks follow the new weights"
        )
    if "data" in allowed:
        lines += [
            f"accepted (data): dataset {name!r} {before} -> {after} rows; it keeps its "
            "position, the epoch in progress is drawn again over the new rows"
            for name, before, after in resized(a.config, config)
        ]
    changes = content_changes(a.content or {}, content)
    for kind in ("data", "functions"):
        if kind in allowed:
            lines += [
                f"accepted ({kind}): {item}; positions continue, values come from the new content"
                for item in changes[kind]
            ]
    return lines or ["nothing differs: the state restores exactly"]


def _shares(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One line per dataset: its share of the weights before and after."""
    before, after = _share_map(old), _share_map(new)
    unit = new.get("weights_unit", "documents")
    out = []
    for name in [*before, *(n for n in after if n not in before)]:
        if name not in after:
            out.append(f"dataset {name!r}: {100 * before[name]:.1f} % -> removed")
        elif name not in before:
            out.append(
                f"dataset {name!r}: added at {100 * after[name]:.1f} % of {unit}, "
                "from its beginning"
            )
        elif abs(before[name] - after[name]) > 1e-12:
            out.append(
                f"dataset {name!r}: {100 * before[name]:.1f} % -> {100 * after[name]:.1f} % "
                f"of {unit}"
            )
    return out


def _share_map(src: dict[str, Any]) -> dict[str, float]:
    names, weights = src.get("names") or [], src.get("weights") or []
    if len(names) != len(weights):
        return {}
    total = float(sum(weights)) or 1.0
    return {n: float(w) / total for n, w in zip(names, weights)}


def _source_type(config: dict[str, Any]) -> Any:
    """The source class whose mixture keys classify the differences (None: unknown)."""
    src = config.get("source")
    if isinstance(src, dict) and src.get("class") == "StaticMixtureWorkSource":
        from ..sources.static_mixture import StaticMixtureWorkSource

        return StaticMixtureWorkSource
    return None
