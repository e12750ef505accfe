"""How close can N particles of LeNet-5 get to one LeNet-5 on an N-times-larger batch? The floor of issue
#11's (a)/(f) ratio for the conv net, measured with hand-written TensorFlow (particle_dense_floor.py does
the same for the MLP).

The network is step_time.py's LeNet-5 on 8x8x1 digits (conv 6@5x5 'same', max-pool 2, conv 16@5x5 'same',
max-pool 2, dense 120, 84, 10; relu), batch 64. Four training-step callables, inside tf.function, timed back
to back in shuffled order:

- shared_pass: one weight set on the (N * 64)-image batch, forward + backward of the summed cross-entropy:
  the arithmetic step_time.py's (f) runs.
- particle_pass: N weight sets in the layout with the fewest ops: the first convolution as ONE convolution
  of the 64 images with the N kernels concatenated (N * 6 filters), the second as one grouped convolution
  (N groups; bayes_keras' grouped_conv2d: the native op where its gradient exists, the portable gradient
  elsewhere), the dense layers as (N, 64, features) batched matmuls after one transpose.
- shared_train / particle_train: the same plus an Adam update (hand-written, the same ops on both sides) of
  the weights, and on the particle side the N(0, 1) log prior of the N weight sets: what (a) and (f) run.

particle_train / shared_train is the floor of (a)/(f) for LeNet-5 that a particle implementation built
on TensorFlow's kernels reaches on this CPU.

Usage:
    python benchmarks/particle_lenet_floor.py                          # ~1 min; oneDNN as TF decides
    TF_ENABLE_ONEDNN_OPTS=0 python benchmarks/particle_lenet_floor.py  # the Eigen kernels
Writes benchmarks/results/particle_lenet_floor[_onednn_on|_onednn_off].{json,md}.
"""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

from bayes_keras.layers.grouped_convolution import grouped_conv2d  # noqa: E402

BATCH, SIDE, CLASSES = 64, 8, 10


def variants(n, rng):
    """The timed callables for n particles: name -> zero-argument tf.function."""
    x = tf.constant(rng.normal(size=(BATCH, SIDE, SIDE, 1)), tf.float32)
    y = tf.constant(rng.integers(0, CLASSES, BATCH), tf.int32)
    x_tiled, y_tiled = tf.tile(x, [n, 1, 1, 1]), tf.tile(y, [n])
    y_particles = tf.tile(y[None], [n, 1])  # (N, batch), particle-major as the logits below

    def weights(shapes):
        return [tf.Variable(rng.normal(size=s) * 0.1, dtype=tf.float32) for s in shapes]

    shared = weights(
        [
            (5, 5, 1, 6),
            (6,),
            (5, 5, 6, 16),
            (16,),
            (64, 120),
            (120,),
            (120, 84),
            (84,),
            (84, CLASSES),
            (CLASSES,),
        ]
    )
    particle = weights(
        [
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
    )

    def cross_entropy(labels, logits):
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))

    def pool(h):
        return tf.nn.max_pool2d(h, 2, 2, "VALID")

    def shared_loss():
        c1, b1, c2, b2, w3, b3, w4, b4, w5, b5 = shared
        h = pool(tf.nn.relu(tf.nn.conv2d(x_tiled, c1, 1, "SAME") + b1))
        h = pool(tf.nn.relu(tf.nn.conv2d(h, c2, 1, "SAME") + b2))
        h = tf.reshape(h, (-1, 64))
        h = tf.nn.relu(tf.matmul(h, w3) + b3)
        h = tf.nn.relu(tf.matmul(h, w4) + b4)
        return cross_entropy(y_tiled, tf.matmul(h, w5) + b5)

    def particle_loss(with_prior):
        c1, b1, c2, b2, w3, b3, w4, b4, w5, b5 = particle
        h = pool(tf.nn.relu(tf.nn.conv2d(x, c1, 1, "SAME") + b1))  # (batch, 4, 4, N * 6)
        h = pool(
            tf.nn.relu(grouped_conv2d(h, c2, n, (1, 1), "SAME", (1, 1)) + b2)
        )  # (batch, 2, 2, N * 16)
        h = tf.reshape(
            tf.transpose(tf.reshape(h, (BATCH, 2, 2, n, 16)), [3, 0, 1, 2, 4]), (n, BATCH, 64)
        )
        h = tf.nn.relu(tf.matmul(h, w3) + b3)
        h = tf.nn.relu(tf.matmul(h, w4) + b4)
        loss = cross_entropy(y_particles, tf.matmul(h, w5) + b5)
        if with_prior:
            loss += tf.add_n([0.5 * tf.reduce_sum(tf.square(w)) for w in particle])
        return loss

    return {
        "shared_pass": harness.gradient_pass(shared_loss, shared),
        "particle_pass": harness.gradient_pass(lambda: particle_loss(False), particle),
        "shared_train": harness.training_step(shared_loss, shared),
        "particle_train": harness.training_step(lambda: particle_loss(True), particle),
    }


def main():
    args = harness.floor_arguments(__doc__.split("\n")[0], rounds=30, steps=20)
    rows = harness.floor_rows(
        variants,
        args,
        lambda times: {
            "pass": harness.paired_ratio(times, "particle_pass", "shared_pass"),
            "train": harness.paired_ratio(times, "particle_train", "shared_train"),
        },
    )

    setting = harness.onednn_setting()
    stem = "particle_lenet_floor" + ("" if setting == "default" else f"_onednn_{setting}")
    lines = [
        "# The floor of N particles of LeNet-5 against one LeNet-5 on an N-times-larger batch",
        "",
        f"Machine: {harness.machine_info()['processor']}, {os.cpu_count()} CPU cores; oneDNN: {setting} "
        "(TF_ENABLE_ONEDNN_OPTS). LeNet-5 on 8x8x1 inputs, batch 64, hand-written inside tf.function; "
        "microseconds (median of rounds); ratios are medians of within-round ratios.",
        "",
        "| N | shared pass us | particle pass us | pass: particle / shared | shared train us | "
        "particle train us | training step: particle / shared |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        m, r = row["median_us"], row["ratio"]
        lines.append(
            f"| {row['num_particles']} | {m['shared_pass']:.0f} | {m['particle_pass']:.0f} | {r['pass']:.2f} | "
            f"{m['shared_train']:.0f} | {m['particle_train']:.0f} | {r['train']:.2f} |"
        )
    lines += [
        "",
        "pass: forward + backward of the summed cross-entropy. Training step: plus an Adam update (of N "
        "weight sets on the particle side) and the particles' N(0, 1) log prior, as step_time.py's (a) and "
        "(f) run; its ratio is the floor of (a)/(f).",
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
