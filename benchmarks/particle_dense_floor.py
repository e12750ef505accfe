"""How close can N particles of an MLP get to one MLP on an N-times-larger batch? The arithmetic floor of
issue #11's (a)/(f) ratio, measured with hand-written TensorFlow.

step_time.py's (f) runs ONE weight set on N copies of the batch: a single GEMM per layer. N particles
have N weight sets, so each layer is N GEMMs, at best one batched matmul. This script times forward +
backward (the summed cross-entropy and its gradients in all weights) of the step_time MLP (64-50-50-10,
batch 64) four ways, inside tf.function, back to back in shuffled order:

- shared: one weight set on the (N * 64)-row batch: (f)'s arithmetic, the floor (f) measures.
- particle_major: N weight sets in the layout with the fewest ops: the first layer one GEMM against the
  concatenated kernels, then (N, batch, features) batched matmuls, one transpose in and one out.
- batch_major: the same in bayes_keras' (batch, N, features) layout (a transpose before and after each
  batched matmul).
- bayes_keras: the same loss through bk.zoo.mlp (the particle layers as users build them).

Plus one hidden layer alone (50 -> 50, forward + backward): one (N * 64) x 50 GEMM against N batched
64 x 50 GEMMs. The ratios to `shared` are the floor for (a)/(f) that no particle implementation built on
TensorFlow's kernels can beat on this CPU.

And whole training steps, as (a) and (f) run them: `shared_train` is `shared` plus an Adam update of its
weights; `particle_train` is `particle_major` plus what every Bayesian particle step adds, a N(0, 1)
log prior on the N weight sets and the same Adam update of N times as many weights (hand-written Adam,
the same ops on both sides). Their ratio is the floor of (a)/(f) itself.

Usage:
    python benchmarks/particle_dense_floor.py                          # ~1 min; oneDNN as TF decides
    TF_ENABLE_ONEDNN_OPTS=0 python benchmarks/particle_dense_floor.py  # the Eigen kernels
Writes benchmarks/results/particle_dense_floor[_onednn_on|_onednn_off].{json,md}.
"""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import bayes_keras as bk  # noqa: E402

BATCH, INPUTS, HIDDEN, CLASSES = 64, 64, 50, 10


def variants(n, rng):
    """The timed callables for n particles: name -> zero-argument tf.function returning gradients."""
    x = tf.constant(rng.normal(size=(BATCH, INPUTS)), tf.float32)
    y = tf.constant(rng.integers(0, CLASSES, BATCH), tf.int32)
    y_particles = tf.tile(y[:, None], [1, n])
    x_tiled, y_tiled = tf.tile(x, [n, 1]), tf.tile(y, [n])

    def weights(shapes):
        return [tf.Variable(rng.normal(size=s) * 0.1, dtype=tf.float32) for s in shapes]

    shared = weights(
        [(INPUTS, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, CLASSES), (HIDDEN,), (HIDDEN,), (CLASSES,)]
    )
    particle = weights(
        [
            (INPUTS, n * HIDDEN),
            (n, HIDDEN, HIDDEN),
            (n, HIDDEN, CLASSES),
            (n * HIDDEN,),
            (n, 1, HIDDEN),
            (n, 1, CLASSES),
        ]
    )
    layer_shared = weights([(HIDDEN, HIDDEN)])
    layer_particle = weights([(n, HIDDEN, HIDDEN)])
    h_tiled = tf.constant(rng.normal(size=(n * BATCH, HIDDEN)), tf.float32)
    h_particles = tf.reshape(h_tiled, [n, BATCH, HIDDEN])

    def cross_entropy(labels, logits):
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))

    def shared_loss():
        w1, w2, w3, b1, b2, b3 = shared
        h = tf.nn.relu(tf.matmul(x_tiled, w1) + b1)
        h = tf.nn.relu(tf.matmul(h, w2) + b2)
        return cross_entropy(y_tiled, tf.matmul(h, w3) + b3)

    def particle_major_loss():
        w1, w2, w3, b1, b2, b3 = particle
        h = tf.nn.relu(tf.matmul(x, w1) + b1)  # (batch, N * hidden)
        h = tf.transpose(tf.reshape(h, [BATCH, n, HIDDEN]), [1, 0, 2])  # (N, batch, hidden)
        h = tf.nn.relu(tf.matmul(h, w2) + b2)
        logits = tf.transpose(tf.matmul(h, w3) + b3, [1, 0, 2])  # (batch, N, classes)
        return cross_entropy(y_particles, logits)

    def batch_major_loss():
        w1, w2, w3, b1, b2, b3 = particle
        h = tf.reshape(tf.nn.relu(tf.matmul(x, w1) + b1), [BATCH, n, HIDDEN])
        h = tf.nn.relu(tf.transpose(tf.matmul(tf.transpose(h, [1, 0, 2]), w2) + b2, [1, 0, 2]))
        logits = tf.transpose(tf.matmul(tf.transpose(h, [1, 0, 2]), w3) + b3, [1, 0, 2])
        return cross_entropy(y_particles, logits)

    def particle_major_loss_and_prior():
        return particle_major_loss() + tf.add_n(
            [0.5 * tf.reduce_sum(tf.square(w)) for w in particle]
        )

    model = bk.zoo.mlp(INPUTS, CLASSES, (HIDDEN, HIDDEN), num_particles=n, likelihood="categorical")
    model(x)

    def bayes_keras_loss():
        return cross_entropy(y_particles, model(x, training=True))

    def layer_loss():
        return tf.reduce_sum(tf.square(tf.matmul(h_tiled, layer_shared[0])))

    def layer_batched_loss():
        return tf.reduce_sum(tf.square(tf.matmul(h_particles, layer_particle[0])))

    return {
        "shared": harness.gradient_pass(shared_loss, shared),
        "particle_major": harness.gradient_pass(particle_major_loss, particle),
        "batch_major": harness.gradient_pass(batch_major_loss, particle),
        "bayes_keras": harness.gradient_pass(bayes_keras_loss, model.trainable_variables),
        "layer_gemm": harness.gradient_pass(layer_loss, layer_shared),
        "layer_batched_gemm": harness.gradient_pass(layer_batched_loss, layer_particle),
        "shared_train": harness.training_step(shared_loss, shared),
        "particle_train": harness.training_step(particle_major_loss_and_prior, particle),
    }


def main():
    args = harness.floor_arguments(__doc__.split("\n")[0], rounds=40, steps=50)

    def ratios(times):
        paired = {
            k: harness.paired_ratio(times, k, "shared")
            for k in ("particle_major", "batch_major", "bayes_keras")
        }
        paired["layer_batched_gemm"] = harness.paired_ratio(
            times, "layer_batched_gemm", "layer_gemm"
        )
        paired["train"] = harness.paired_ratio(times, "particle_train", "shared_train")
        return paired

    rows = harness.floor_rows(variants, args, ratios)

    setting = harness.onednn_setting()
    stem = "particle_dense_floor" + ("" if setting == "default" else f"_onednn_{setting}")
    lines = [
        "# The arithmetic floor of N particles of an MLP against one MLP on an N-times-larger batch",
        "",
        f"Machine: {harness.machine_info()['processor']}, {os.cpu_count()} CPU cores; oneDNN: {setting} "
        "(TF_ENABLE_ONEDNN_OPTS). Forward + backward of the summed cross-entropy, MLP 64-50-50-10, batch 64, "
        "inside tf.function; microseconds (median of rounds); ratios are medians of within-round ratios to "
        "`shared` (one weight set on the N x 64 batch: the arithmetic step_time.py's (f) runs).",
        "",
        "| N | shared us | particle-major us | batch-major us | bayes_keras us | particle-major / shared | "
        "batch-major / shared | bayes_keras / shared | one layer: N batched GEMMs / one GEMM | "
        "shared_train us | particle_train us | training step: particle / shared |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        m, r = row["median_us"], row["ratio"]
        lines.append(
            f"| {row['num_particles']} | {m['shared']:.0f} | {m['particle_major']:.0f} | {m['batch_major']:.0f} | "
            f"{m['bayes_keras']:.0f} | {r['particle_major']:.2f} | {r['batch_major']:.2f} | "
            f"{r['bayes_keras']:.2f} | {r['layer_batched_gemm']:.2f} | {m['shared_train']:.0f} | "
            f"{m['particle_train']:.0f} | {r['train']:.2f} |"
        )
    lines += [
        "",
        "particle-major / shared is the least any N-weight-set MLP forward + backward built on TensorFlow's "
        "kernels costs relative to (f)'s arithmetic on this machine. The training-step columns add what "
        "step_time.py's (a) and (f) add: an Adam update (of N weight sets on the particle side) and, for the "
        "particles, their N(0, 1) log prior; their ratio is the floor of (a)/(f).",
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
