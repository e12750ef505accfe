"""Particle convolutions train whatever TF_ENABLE_ONEDNN_OPTS says (issue: Eigen CPU kernels have no
grouped-convolution gradient). The variable only acts before TensorFlow is imported, so each setting
runs in its own subprocess; gradients are checked against a per-particle loop of keras.layers.Conv2D."""

import os
import subprocess
import sys

import pytest
from paths import SCRIPTS

SCRIPT = os.path.join(SCRIPTS, "conv_gradient_check.py")


@pytest.mark.subprocess
@pytest.mark.parametrize("onednn,implementation", [("0", "auto"), ("1", "auto"), ("1", "portable")])
def test_particle_conv_trains_with_and_without_onednn(onednn, implementation):
    env = dict(
        os.environ, TF_ENABLE_ONEDNN_OPTS=onednn, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES=""
    )
    result = subprocess.run(
        [sys.executable, SCRIPT, implementation],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0 and "ALL OK" in result.stdout, (
        result.stdout + result.stderr[-4000:]
    )
    if (
        onednn == "0"
    ):  # the Eigen kernels have no native grouped gradient: the portable one must be chosen
        assert "gradient implementation: portable" in result.stdout, result.stdout
