"""Content fingerprints: cheap digests of the data and of the user's functions.
(``docs/design.md`` §8)

The configuration fingerprint (``fingerprint.py``) sees names, lengths, weights and
operator parameters. It cannot see rows edited in place, a reordered dataset of the
same length, or another function under the same name, and each of those gives a
different stream. So a checkpoint also stores a digest per component and per
map/filter function, and a restore compares them (``checkpoint/restore.py``):

* a component: ``zephon_fingerprint()`` when the dataset defines one (the HF adapter
  uses ``Dataset._fingerprint``); an HF ``datasets.Dataset`` by its ``_fingerprint``;
  otherwise the rows themselves, all of them up to :data:`FULL_ROWS` rows, else the
  first, the last and :data:`SAMPLED_ROWS` rows picked by the source seed;
* a function: ``version=`` given to ``map``/``filter``; ``zephon_fingerprint()`` when
  the function (or callable object) defines one; otherwise what determines its
  outputs, never where it lives: its byte code and constants (not its name, module,
  file or line numbers), defaults, closure values, the plain module globals it reads,
  and for callable objects their state (``__getstate__`` if defined, else the public
  attributes: leading-underscore attributes are taken for caches). A captured object
  the code only reads fields of (``args.seq_len``, ``cfg["k"]``, ``cfg.get("k")``:
  ``code_reads.py``) counts by those fields alone, so an unrelated argument may
  differ. Tokenizers count by what determines their encodings
  (``tokenizer_digest.py``). Classes of the user's own code count by their name,
  without their module.

:func:`function_parts` digests the same pieces one by one ("code", "closure 'args'.
seq_len", "global 'tok' (tokenizer) model", ...), so a refusal names what changed.

Sampling is cheap and misses an edit of an unsampled row; the replay value digest
(``value_digest.py``) catches such an edit when it touches the record behind a lane's
last delivered output. Byte code changes with the Python version: pin a function with
``version=`` to resume a run under another Python.

Not a behavioural probe: running the user's functions over sample rows at every
compile would call them (and read rows, from object storage too) where no run asked
for it, and outputs that agree on a few rows are weak evidence. A change of byte code
is refused as "code differs", naming ``version=`` as the way to vouch for a refactor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..rng import derive_seed
from .digest_walk import Budgeted, hf_fingerprint
from .function_parts import function_parts, is_code_part
from .tokenizer_digest import shared_texts

FULL_ROWS = 64  # datasets up to this many rows are digested whole
SAMPLED_ROWS = 32  # otherwise: first, last and this many seed-picked rows

__all__ = [
    "component_fingerprint",
    "content_fingerprints",
    "digest_value",
    "function_fingerprint",
    "function_parts",
    "is_code_part",
]


def content_fingerprints(source: Any, ops: Sequence[Any]) -> dict[str, Any]:
    """``{"components": {name: digest}, "ops": {operator name: digest}, "parts":
    {operator name: {part: digest}}}`` of a plan."""
    components = getattr(source, "content_fingerprints", None)
    out_ops, parts = {}, {}
    with shared_texts():  # a tokenizer is serialized once for the digest and the parts
        for op in ops:
            fp = op.content_fingerprint()
            if fp is not None:
                out_ops[op.name] = fp
                named = getattr(op, "content_parts", None)
                if callable(named):
                    parts[op.name] = named()
    return {
        "components": dict(components()) if components is not None else {},
        "ops": out_ops,
        "parts": parts,
    }


def component_fingerprint(
    dataset: Any, read: Any, length: int, key: int, hasher: Callable[[], Any] = Budgeted
) -> str:
    """Digest of one component; ``read(rows)`` reads rows with one batched read.
    ``hasher``: the walk its rows are digested by (``legacy_digest.Budgeted``: as states
    written before per-part digests hold them)."""
    own = getattr(dataset, "zephon_fingerprint", None)
    if callable(own):
        return "user:" + str(own())
    hf = hf_fingerprint(dataset)
    if hf is not None:
        return "hf:" + hf
    if length <= FULL_ROWS:
        rows = list(range(length))
    else:
        picks = {0, length - 1}
        picks.update(derive_seed(key, "content", i) % length for i in range(SAMPLED_ROWS))
        rows = sorted(picks)
    h = hasher()
    h.walk(length)
    for r, value in zip(rows, read(rows)):
        h.walk(r)
        h.walk(value)
    return "rows:" + h.hexdigest()


def function_fingerprint(fn: Any, version: Any = None) -> str:
    """Digest of a user function (see the module docstring for what it covers)."""
    if version is not None:
        return "version:" + str(version() if callable(version) else version)
    h = Budgeted()
    h.walk(fn)
    return "code:" + h.hexdigest()


def digest_value(value: Any) -> str:
    """Digest of any value by the rules above (for tests and custom fingerprints)."""
    h = Budgeted()
    h.walk(value)
    return h.hexdigest()
