import sys
from pathlib import Path

# shared helpers: ``helpers`` (tests/) and the integration helpers (tests/integrations/)
sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent / "integrations")]
