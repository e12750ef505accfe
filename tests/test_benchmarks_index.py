"""benchmarks/README.md indexes every benchmark script and every result file."""

import os
from paths import ROOT

BENCHMARKS = os.path.join(ROOT, "benchmarks")


def test_the_index_lists_every_script_and_result():
    index = open(os.path.join(BENCHMARKS, "README.md")).read()
    scripts = [f for f in os.listdir(BENCHMARKS) if f.endswith(".py") and f != "harness.py"]
    assert [s for s in scripts if f"`{s}`" not in index] == []
    stems = {f.split(".")[0] for f in os.listdir(os.path.join(BENCHMARKS, "results"))}
    unlisted = [s for s in stems if f"`{s}`" not in index and not s.startswith("lenet_digits")]
    assert sorted(unlisted) == []
