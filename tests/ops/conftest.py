import sys
from pathlib import Path

# Makes ``opkit`` (helpers shared by the operator tests) importable.
sys.path.insert(0, str(Path(__file__).parent))
