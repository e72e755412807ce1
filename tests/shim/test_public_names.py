"""``goodput.shim``'s names load lazily, each from the one module that defines it."""

from __future__ import annotations

import inspect
import subprocess
import sys

import goodput.shim


def test_every_public_name_is_the_defining_modules_own() -> None:
    for name, module in goodput.shim._EXPORTS.items():
        defined = getattr(__import__(module, fromlist=[name]), name)
        assert getattr(goodput.shim, name) is defined, name
        if inspect.isclass(defined) or inspect.isfunction(defined):  # not an alias or a constant
            assert defined.__module__ == module, f"{name} is not {module}'s"


def test_the_exit_code_comes_without_torch() -> None:
    """A launcher checks a rank's exit code against EXIT_TERMINATED without loading torch."""
    code = (
        "import sys; from goodput.shim import EXIT_TERMINATED;"
        " assert EXIT_TERMINATED == 143 and 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
