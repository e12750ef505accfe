"""What do per-example squared gradients (the empirical Fisher's diagonal) cost on top of a particle step's
forward and backward pass? The arithmetic floor of issue #11's MGVBP f/a ratio, measured with hand-written
TensorFlow.

For a Dense layer with input a_b and pre-activation gradient e_b, the weight gradient is sum_b a_b e_b^T and
the empirical Fisher's diagonal sum_b (a_b e_b^T)^2 = sum_b a_b^2 (e_b^2)^T: one more GEMM of the size of
the weight-gradient GEMM. A hidden layer's pass has three such GEMMs (forward, input gradient, weight
gradient), the first layer two, so the squared gradients add a third to a half of the layers' arithmetic.
This script times, for the step_time MLP (64-50-50-10, batch 64) with N particle weight sets in the
fastest hand-written layout (particle_dense_floor.py's particle-major):

- pass: forward + backward (the summed cross-entropy's gradients in all weights);
- pass + squared: the same plus every layer's batch sum of squared per-example gradients, from the
  pre-activation gradients the backward pass computes anyway.

Usage:
    python benchmarks/empirical_fisher_floor.py                          # ~1 min
    TF_ENABLE_ONEDNN_OPTS=0 python benchmarks/empirical_fisher_floor.py
Writes benchmarks/results/empirical_fisher_floor[_onednn_on|_onednn_off].{json,md}.
"""

import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

BATCH, SIZES = 64, (64, 50, 50, 10)


def flop_ratio():
    """(pass + squared) / pass in multiply-adds of the GEMMs alone."""
    gemms = [i * o for i, o in zip(SIZES[:-1], SIZES[1:])]
    passes = 2 * gemms[0] + 3 * sum(gemms[1:])  # the first layer needs no input gradient
    return (passes + sum(gemms)) / passes


def variants(n, rng):
    x = tf.constant(rng.normal(size=(BATCH, SIZES[0])), tf.float32)
    y = tf.constant(rng.integers(0, SIZES[-1], BATCH), tf.int32)
    labels = tf.tile(y[None], [n, 1])
    kernels = [tf.Variable(rng.normal(size=(n, i, o)) * 0.1, dtype=tf.float32) for i, o in zip(SIZES[:-1], SIZES[1:])]

    def forward():
        """Layer inputs and pre-activations, particle-major (N, batch, features)."""
        inputs, pre = [], []
        h = tf.tile(x[None], [n, 1, 1])
        for i, k in enumerate(kernels):
            inputs.append(h)
            z = tf.matmul(h, k)
            pre.append(z)
            h = tf.nn.relu(z) if i < len(kernels) - 1 else z
        return inputs, pre, tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, h))

    @tf.function
    def pass_only():
        with tf.GradientTape() as tape:
            _, _, loss = forward()
        return tape.gradient(loss, kernels)

    @tf.function
    def pass_and_squared():
        with tf.GradientTape() as tape:
            inputs, pre, loss = forward()
        grads = tape.gradient(loss, kernels + pre)
        weight_grads, pre_grads = grads[:len(kernels)], grads[len(kernels):]
        squared = [tf.matmul(tf.square(a), tf.square(e), transpose_a=True) for a, e in zip(inputs, pre_grads)]
        return weight_grads + squared

    return {"pass": pass_only, "pass_and_squared": pass_and_squared}


def main():
    args = harness.floor_arguments(__doc__.split("\n")[0], rounds=40, steps=50)
    rows = harness.floor_rows(variants, args, lambda times: harness.paired_ratio(times, "pass_and_squared", "pass"))

    setting = harness.onednn_setting()
    stem = "empirical_fisher_floor" + ("" if setting == "default" else f"_onednn_{setting}")
    lines = ["# The cost of per-example squared gradients on top of a particle MLP's forward and backward pass", "",
             f"Machine: {harness.machine_info()['processor']}, {os.cpu_count()} CPU cores; oneDNN: {setting} "
             "(TF_ENABLE_ONEDNN_OPTS). MLP 64-50-50-10, batch 64, N particle weight sets, particle-major, inside "
             "tf.function; microseconds (median of rounds); the ratio is the median of within-round ratios. "
             f"In GEMM multiply-adds alone the squared gradients make the pass {flop_ratio():.2f}x.", "",
             "| N | pass us | pass + squared gradients us | ratio |", "|---|---|---|---|"]
    for row in rows:
        m = row["median_us"]
        lines.append(f"| {row['num_particles']} | {m['pass']:.0f} | {m['pass_and_squared']:.0f} | {row['ratio']:.2f} |")
    lines += ["", "MGVBP with curvature=\"empirical_fisher\" runs this extra arithmetic every step on top of what "
              "IndependentParticles runs; the ratio bounds its f/a from below wherever the pass dominates the step.",
              "", f"Command: `python {' '.join(sys.argv)}`"]
    print("\n".join(lines))
    harness.save_results(stem, {"command": "python " + " ".join(sys.argv), "machine": harness.machine_info(),
                                "onednn": setting, "flop_ratio": flop_ratio(), "args": vars(args), "rows": rows}, lines)


if __name__ == "__main__":
    main()
