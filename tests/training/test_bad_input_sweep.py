"""The bad-input sweep of benchmarks/bad_inputs.py as a test: every public class, every numeric constructor
argument, each of NaN, +inf, -inf, a string and a bool, through the constructor and through from_config,
is refused at once with a ValueError or TypeError that names the argument (800 cases, all clear)."""

import os
import sys

from paths import ROOT

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bad_inputs  # noqa: E402


def test_every_bad_numeric_argument_is_refused_at_construction():
    rows = list(bad_inputs.cases())
    assert len(rows) >= 250, len(rows)
    assert len({r[0] for r in rows}) >= 25  # classes covered
    defects = [r for r in rows if r[4] != "clear"]
    assert not defects, defects
