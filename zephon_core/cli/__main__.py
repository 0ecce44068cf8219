"""``python -m zephon_core.cli``: the ``zephon`` command without its console script."""

from __future__ import annotations

from . import main

main()
