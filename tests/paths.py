"""Where the tests find the repository and their fixture files, wherever a test module sits."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
