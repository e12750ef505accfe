"""Particle attention against one Keras MultiHeadAttention on an N-times-larger batch (the same arithmetic: N
weight sets on a batch of B against one weight set on N x B examples), forward + backward of a summed output,
inside tf.function, back to back in shuffled order (harness.interleaved_microseconds):

- keras_tiled: keras.layers.MultiHeadAttention on (N * B, T, F): the floor, one set of projections.
- particles: bayes_keras.layers.MultiHeadAttention on (B, N, T, F): each particle its own projections.
- particles_first: the same layer starting the particle axis on (B, T, F) (num_particles=N).
- lora: MultiHeadAttention(lora_rank=4) on (B, T, F): query / value adapted per particle, keys computed once.

Usage:
    python benchmarks/attention_floor.py [--particles 4 8 16] [--rounds 7] [--steps 20]
Writes benchmarks/results/attention_floor[_onednn_on|_onednn_off].{json,md}.
"""

import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import keras  # noqa: E402

import bayes_keras as bk  # noqa: E402

BATCH, TIME, FEATURES, HEADS, KEY_DIM = 32, 16, 64, 4, 16


def variants(n, rng):
    x = tf.constant(rng.normal(size=(BATCH, TIME, FEATURES)), tf.float32)
    x_particles = tf.constant(rng.normal(size=(BATCH, n, TIME, FEATURES)), tf.float32)
    x_tiled = tf.reshape(x_particles, (BATCH * n, TIME, FEATURES))
    layers = {
        "keras_tiled": (keras.layers.MultiHeadAttention(HEADS, KEY_DIM), x_tiled),
        "particles": (bk.layers.MultiHeadAttention(HEADS, KEY_DIM), x_particles),
        "particles_first": (bk.layers.MultiHeadAttention(HEADS, KEY_DIM, num_particles=n), x),
        "lora": (bk.layers.MultiHeadAttention(HEADS, KEY_DIM, lora_rank=4, num_particles=n), x),
    }
    fns = {}
    for name, (layer, inputs) in layers.items():
        layer(inputs, inputs)
        fns[name] = harness.gradient_pass(
            lambda layer=layer, inputs=inputs: tf.reduce_sum(layer(inputs, inputs)),
            layer.trainable_variables,
        )
    return fns


def main():
    args = harness.floor_arguments(__doc__.splitlines()[0], rounds=7, steps=20)
    if args.particles == [5, 10, 20]:
        args.particles = [4, 8, 16]
    rows = harness.floor_rows(
        variants,
        args,
        lambda times: {
            name: harness.paired_ratio(times, name, "keras_tiled")
            for name in ("particles", "particles_first", "lora")
        },
    )
    machine = harness.machine_info()
    lines = [
        "# Particle attention against Keras attention on the N-times batch",
        "",
        f"`python benchmarks/attention_floor.py --particles {' '.join(map(str, args.particles))}`; batch {BATCH}, "
        f"time {TIME}, features {FEATURES}, {HEADS} heads of {KEY_DIM}; forward + backward; median of "
        f"{args.rounds} interleaved rounds of {args.steps} calls, ratios paired within rounds. Machine: "
        f"{machine['processor']}, {machine['cpu_count']} CPUs, oneDNN {machine['onednn']}.",
        "",
        "| N | Keras on N x batch (us) | particles | ratio | particles, first layer | ratio | LoRA r=4, first layer "
        "| ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        m, r = row["median_us"], row["ratio"]
        lines.append(
            f"| {row['num_particles']} | {m['keras_tiled']:.0f} | {m['particles']:.0f} | {r['particles']:.2f} "
            f"| {m['particles_first']:.0f} | {r['particles_first']:.2f} | {m['lora']:.0f} | {r['lora']:.2f} |"
        )
    suffix = {"on": "_onednn_on", "off": "_onednn_off"}.get(harness.onednn_setting(), "")
    paths = harness.save_results(
        "attention_floor" + suffix, {"args": vars(args), "machine": machine, "rows": rows}, lines
    )
    print("\n".join(lines))
    print("wrote", *paths)


if __name__ == "__main__":
    main()
