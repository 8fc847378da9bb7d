"""The README's "Testing your handlers" shows the sample user project's files as they are: that project's
tests run against the installed wheel (tests/e2e/test_wheel.py), so the README's example is run too."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "tests" / "data" / "sample_user_project"


def _section() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme[readme.index("## Testing your handlers") : readme.index("## Operating")]


def test_the_readme_example_is_the_sample_projects_code_verbatim() -> None:
    blocks = re.findall(r"```python\n# (\S+)[^\n]*\n(.*?)```", _section(), flags=re.S)
    shown = {path: code for path, code in blocks}
    assert set(shown) == {"shop/handlers.py", "tests/conftest.py", "tests/test_orders.py"}
    for path, code in shown.items():
        assert code == (SAMPLE / path).read_text(), path
