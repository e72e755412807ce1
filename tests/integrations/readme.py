"""The README's complete scripts, found by their ``<!-- readme-script: NAME -->`` marker."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
_SCRIPT = re.compile(r"<!-- readme-script: ([\w-]+) -->\n```python\n(.*?)```", re.DOTALL)


def readme_scripts() -> dict[str, str]:
    """Name -> source of every marked script in the README."""
    return {name: source for name, source in _SCRIPT.findall(README.read_text())}


def write_script(name: str, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "train.py"
    path.write_text(readme_scripts()[name])
    return path
