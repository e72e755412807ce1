"""Run by the interpreter of every process goodput launches, before its script: this
directory is first on the ``PYTHONPATH`` its launcher gives it
(``goodput.launch.rank_env.with_rank_boot``). It hooks the process's uncaught exceptions
(:mod:`goodput.shim.exit_hook`) and then runs the ``sitecustomize`` this one shadows, if any.
Where the interpreter has no goodput, it does nothing."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _hook() -> None:
    try:
        from goodput.shim.exit_hook import install
    except ImportError:  # an interpreter without goodput: the exit codes stay Python's
        return
    install()


def _shadowed() -> None:
    """The next ``sitecustomize`` on the path (a distribution's, a virtualenv's) runs too;
    this directory is skipped under every name (the rank image links it: a second visit
    would run this file again)."""
    here = os.path.realpath(os.path.dirname(__file__))
    rest = [p for p in sys.path if os.path.realpath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_hook()
_shadowed()
