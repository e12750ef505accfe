"""Every example runs from a fresh checkout, at tiny size (the README's commands at full size)."""

import os
import subprocess
import sys

import pytest
from paths import ROOT

EXAMPLES = os.path.join(ROOT, "examples")

CASES = {
    "lenet_digits.py": (["--seeds", "0", "--epochs", "1", "--out", ""], "GPF"),
    "lenet_digits_vi.py": (["--seeds", "0", "--epochs", "1", "--out", ""], "MeanFieldVI"),
    "regression_intervals.py": (["--epochs", "3", "--plot", ""], "95% interval coverage"),
    "convert_keras_model.py": (
        ["--epochs", "1", "--bayesian-epochs", "1"],
        "bayesianized, before training",
    ),
    "text_gru.py": (["--epochs", "1", "--particles", "2"], "Bayesian GRU (GPF, 2 particles)"),
    "lenet_digits_svgd.py": (["--epochs", "1", "--particles", "2"], "MatrixSVGD (KFAC)"),
    "lenet_digits_refinement.py": (
        ["--epochs", "1", "--stages", "2", "--steps", "5"],
        "ELBO_aux per example",
    ),
    "lenet_digits_sequential.py": (
        ["--epochs", "1", "--iterations", "1", "--batches", "2"],
        "held-out accuracy after each batch",
    ),
    "distributed_lenet.py": (
        ["--epochs", "1", "--particles", "2", "--cpu-devices", "2"],
        "on 2 replica(s)",
    ),
    "resnet20_digits.py": (
        ["--epochs", "1", "--particles", "2", "--hybrid"],
        "hybrid ResNet-20 (GPF, 2 particles)",
    ),
    "transfer_digits.py": (
        [
            "--pretrain-epochs",
            "1",
            "--epochs",
            "1",
            "--particles",
            "2",
            "--parts",
            "head",
            "--optimizers",
            "GPF",
            "--variants",
            "keras",
            "bayesian",
        ],
        "Bayesian head, GPF (2)",
    ),
}


def test_every_example_is_covered():
    assert sorted(CASES) == sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py"))


@pytest.mark.subprocess
@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs(name):
    args, expected = CASES[name]
    done = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, name)] + args,
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        cwd=EXAMPLES,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert expected in done.stdout, done.stdout[-2000:]
