"""The call-level bad-input sweep of benchmarks/call_sweep.py as a test (issue: the API's edges): fit / evaluate /
predict / predictive / uncertainty / predict_particles, bayesianize, refine, the metric functions, the datasets,
save / load_model / export and the adapters, each called with one bad argument (over 300 cases, every case under a
timeout in a worker subprocess), all refused at once or warned with a message that names the argument and the
value: none obscure, silent or hanging."""

import collections
import os
import sys

from paths import ROOT

import pytest

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import call_sweep  # noqa: E402


@pytest.mark.subprocess
def test_every_bad_call_argument_is_refused_or_warned_by_name():
    rows = call_sweep.run()
    assert len(rows) >= 300, len(rows)
    calls = collections.Counter(r["api"].split(".")[0] for r in rows)
    for api in (
        "fit",
        "evaluate",
        "predict",
        "predictive",
        "uncertainty",
        "predict_particles",
        "bayesianize",
        "refine",
        "metrics",
        "datasets",
        "save",
        "load_model",
        "export",
    ):
        assert calls[api] > 0, api
    defects = [r for r in rows if not r["outcome"].startswith("clear")]
    assert not defects, defects


def test_the_sweep_grades_what_it_should():
    # the grader itself: a message naming both is clear, one naming only the argument is not, no error is silent
    def fail(message):
        def call(F):
            raise ValueError(message)

        return call

    assert (
        call_sweep.outcome(
            None, fail("fit: batch_size must be positive; got -2."), "batch_size", ("-2",)
        )
        == "clear"
    )
    assert call_sweep.outcome(
        None, fail("fit: batch_size must be positive."), "batch_size", ("-2",)
    ).startswith("unclear")
    assert call_sweep.outcome(None, lambda F: float("nan"), "x", ("NaN",)) == "silent NaN"
    assert call_sweep.outcome(None, lambda F: 1.0, "x", ("NaN",)) == "silent"
    assert call_sweep.outcome(None, lambda F: {}["k"], "x", ("k",)).startswith("obscure")
