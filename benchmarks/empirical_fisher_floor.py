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

and the same for the step_time LeNet-5 (8x8x1 digits, particle_lenet_floor.py's layout: the first
convolution against the N concatenated kernels, the second one grouped convolution, batched matmuls for
the dense layers, biases everywhere). A convolution's per-example gradient sums patch x output-gradient
products over the output locations before it is squared: per example (and particle) a (K x T)(T x F)
matmul of its input patches (one tf.image.extract_patches) with its output gradients.

Usage:
    python benchmarks/empirical_fisher_floor.py                          # ~3 min
    TF_ENABLE_ONEDNN_OPTS=0 python benchmarks/empirical_fisher_floor.py
Writes benchmarks/results/empirical_fisher_floor[_onednn_on|_onednn_off].{json,md}.
"""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

from bayes_keras.layers.grouped_convolution import grouped_conv2d  # noqa: E402

BATCH, SIZES, CLASSES = 64, (64, 50, 50, 10), 10


def flop_ratio(model="mlp"):
    """(pass + squared) / pass in multiply-adds of the GEMMs / convolutions alone (per example and particle)."""
    if model == "mlp":
        gemms = [i * o for i, o in zip(SIZES[:-1], SIZES[1:])]
    else:  # locations x patch size x filters for the convolutions, in x out for the dense layers
        gemms = [64 * 25 * 6, 16 * 150 * 16, 64 * 120, 120 * 84, 84 * CLASSES]
    passes = 2 * gemms[0] + 3 * sum(gemms[1:])  # the first layer needs no input gradient
    return (passes + sum(gemms)) / passes


def passes(forward, weights, squared):
    """The two timed callables: forward + backward of `forward()`'s loss in `weights`, and the same plus
    `squared(layer inputs, pre-activation gradients)`, the per-example squared-gradient sums."""

    @tf.function
    def pass_only():
        with tf.GradientTape() as tape:
            _, _, loss = forward()
        return tape.gradient(loss, weights)

    @tf.function
    def pass_and_squared():
        with tf.GradientTape() as tape:
            inputs, pre, loss = forward()
        grads = tape.gradient(loss, weights + pre)
        return grads[: len(weights)] + squared(inputs, grads[len(weights) :])

    return {"pass": pass_only, "pass_and_squared": pass_and_squared}


def variants(n, rng):
    x = tf.constant(rng.normal(size=(BATCH, SIZES[0])), tf.float32)
    y = tf.constant(rng.integers(0, SIZES[-1], BATCH), tf.int32)
    labels = tf.tile(y[None], [n, 1])
    kernels = [
        tf.Variable(rng.normal(size=(n, i, o)) * 0.1, dtype=tf.float32)
        for i, o in zip(SIZES[:-1], SIZES[1:])
    ]

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

    def squared(inputs, pre_grads):
        return [
            tf.matmul(tf.square(a), tf.square(e), transpose_a=True)
            for a, e in zip(inputs, pre_grads)
        ]

    return passes(forward, kernels, squared)


def lenet_variants(n, rng):
    x = tf.constant(rng.normal(size=(BATCH, 8, 8, 1)), tf.float32)
    y = tf.constant(rng.integers(0, CLASSES, BATCH), tf.int32)
    labels = tf.tile(y[None], [n, 1])
    shapes = [
        (5, 5, 1, n * 6),
        (n * 6,),
        (5, 5, 6, n * 16),
        (n * 16,),
        (n, 64, 120),
        (n, 1, 120),
        (n, 120, 84),
        (n, 1, 84),
        (n, 84, CLASSES),
        (n, 1, CLASSES),
    ]
    weights = [tf.Variable(rng.normal(size=s) * 0.1, dtype=tf.float32) for s in shapes]

    def pool(h):
        return tf.nn.max_pool2d(h, 2, 2, "VALID")

    def forward():
        """Layer inputs and pre-activations: images (batch, H, W, N*C), dense particle-major (N, batch, .)."""
        c1, b1, c2, b2, w3, b3, w4, b4, w5, b5 = weights
        z1 = tf.nn.conv2d(x, c1, 1, "SAME") + b1  # (batch, 8, 8, N * 6)
        h1 = pool(tf.nn.relu(z1))
        z2 = grouped_conv2d(h1, c2, n, (1, 1), "SAME", (1, 1)) + b2  # (batch, 4, 4, N * 16)
        h = pool(tf.nn.relu(z2))
        h3 = tf.reshape(
            tf.transpose(tf.reshape(h, (BATCH, 2, 2, n, 16)), [3, 0, 1, 2, 4]), (n, BATCH, 64)
        )
        z3 = tf.matmul(h3, w3) + b3
        h4 = tf.nn.relu(z3)
        z4 = tf.matmul(h4, w4) + b4
        h5 = tf.nn.relu(z4)
        z5 = tf.matmul(h5, w5) + b5
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, z5))
        return [x, h1, h3, h4, h5], [z1, z2, z3, z4, z5], loss

    def patches(images, size):
        return tf.image.extract_patches(
            images, [1, size, size, 1], [1, 1, 1, 1], [1, 1, 1, 1], "SAME"
        )

    def squared(inputs, pre_grads):
        x1, h1, h3, h4, h5 = inputs
        e1, e2, e3, e4, e5 = pre_grads
        # first convolution: one (25 x 64)(64 x N*6) product per example serves every particle
        p1 = tf.reshape(patches(x1, 5), (BATCH, 64, 25))
        g1 = tf.matmul(p1, tf.reshape(e1, (BATCH, 64, n * 6)), transpose_a=True)
        out = [
            tf.reduce_sum(tf.square(g1), 0),
            tf.reduce_sum(tf.square(tf.reduce_sum(e1, [1, 2])), 0),
        ]
        # grouped convolution: per example and particle (150 x 16)(16 x 16)
        p2 = tf.reshape(
            tf.transpose(tf.reshape(patches(h1, 5), (BATCH, 16, 25, n, 6)), [0, 3, 1, 2, 4]),
            (BATCH, n, 16, 150),
        )
        t2 = tf.transpose(tf.reshape(e2, (BATCH, 16, n, 16)), [0, 2, 1, 3])
        g2 = tf.matmul(p2, t2, transpose_a=True)
        out += [
            tf.reduce_sum(tf.square(g2), 0),
            tf.reduce_sum(tf.square(tf.reduce_sum(e2, [1, 2])), 0),
        ]
        for a, e in ((h3, e3), (h4, e4), (h5, e5)):
            out += [
                tf.matmul(tf.square(a), tf.square(e), transpose_a=True),
                tf.reduce_sum(tf.square(e), 1),
            ]
        return out

    return passes(forward, weights, squared)


def main():
    args = harness.floor_arguments(__doc__.split("\n")[0], rounds=40, steps=50)
    rows = []
    for model, make in (("mlp", variants), ("lenet5", lenet_variants)):
        print(model, flush=True)
        for row in harness.floor_rows(
            make, args, lambda t: harness.paired_ratio(t, "pass_and_squared", "pass")
        ):
            rows.append({"model": model, "flop_ratio": flop_ratio(model), **row})

    setting = harness.onednn_setting()
    stem = "empirical_fisher_floor" + ("" if setting == "default" else f"_onednn_{setting}")
    lines = [
        "# The cost of per-example squared gradients on top of a particle net's forward and backward pass",
        "",
        f"Machine: {harness.machine_info()['processor']}, {os.cpu_count()} CPU cores; oneDNN: {setting} "
        "(TF_ENABLE_ONEDNN_OPTS). MLP 64-50-50-10 and LeNet-5 (8x8x1), batch 64, N particle weight sets, "
        "hand-written inside tf.function; microseconds (median of rounds); the ratio is the median of "
        "within-round ratios; multiply-adds: (pass + squared) / pass counted over the GEMMs and convolutions.",
        "",
        "| model | N | pass us | pass + squared gradients us | ratio | multiply-adds |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        m = row["median_us"]
        lines.append(
            f"| {row['model']} | {row['num_particles']} | {m['pass']:.0f} | {m['pass_and_squared']:.0f} | "
            f"{row['ratio']:.2f} | {row['flop_ratio']:.2f} |"
        )
    lines += [
        "",
        'MGVBP with curvature="empirical_fisher" runs this extra arithmetic every step on top of what '
        "IndependentParticles runs; the ratio bounds its f/a from below wherever the pass dominates the step.",
        "",
        f"Command: `python {' '.join(sys.argv)}`",
    ]
    print("\n".join(lines))
    harness.save_results(
        stem,
        {
            "command": "python " + " ".join(sys.argv),
            "machine": harness.machine_info(),
            "onednn": setting,
            "args": vars(args),
            "rows": rows,
        },
        lines,
    )


if __name__ == "__main__":
    main()
