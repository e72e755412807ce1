"""Every ``# type: ignore`` in libs/ and services/ names its error code and says why.

An ignore silences the type checker on its line for good: without a reason, nobody can tell
a wrong third-party stub (kept) from a shortcut that hides a real mismatch (to be fixed), and
the next change copies it. The form is ``# type: ignore[code]  # why``: the reason names the
library or the runtime fact (``torch's Store stub lacks clone``), on the same line.

Comments are read with :mod:`tokenize`, so a string that merely contains the words is no hit.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = (ROOT / "libs", ROOT / "services")

IGNORE = re.compile(r"#\s*type:\s*ignore\b")
#: the one accepted form: the error code(s), two spaces, then a reason with a word in it
WITH_REASON = re.compile(r"^# type: ignore\[[a-z-]+(, [a-z-]+)*\]  # .*[A-Za-z]{2}")


def unexplained(source: str) -> list[tuple[int, str]]:
    """(line, comment) of each ``type: ignore`` comment in ``source`` without code or reason."""
    return [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
        and IGNORE.search(token.string)
        and not WITH_REASON.match(token.string)
    ]


def test_every_type_ignore_says_why() -> None:
    files = sorted(path for root in CHECKED for path in root.rglob("*.py"))
    assert len(files) > 300, "the source trees were not found"
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {comment}"
        for path in files
        for line, comment in unexplained(path.read_text(encoding="utf-8"))
    ]
    assert not problems, (
        "a `# type: ignore` without its error code or its reason (write "
        "`# type: ignore[code]  # why`, the why naming the library or the runtime fact):\n"
        + "\n".join(problems)
    )


def test_the_check_tells_a_reason_from_none() -> None:
    """The check itself: a bare ignore, one without a code and one without a reason are
    found; one with both is not, nor the words inside a string."""
    source = "\n".join(
        [
            "a = f(1)  # type: ignore",
            "b = f(2)  # type: ignore[arg-type]",
            "c = f(3)  # type: ignore[arg-type]  #",
            "d = f(4)  # type: ignore  # the stub says int",
            "e = f(5)  # type: ignore[arg-type]  # nats-py annotates an int; it is seconds",
            "g = f(6)  # type: ignore[attr-defined, union-attr]  # torch's stub lacks clone",
            'h = "# type: ignore"',
            "",
        ]
    )
    assert [line for line, _ in unexplained(source)] == [1, 2, 3, 4]
