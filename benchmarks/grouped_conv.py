"""Forward + backward time of one particle convolution: native vs portable gradient, both oneDNN settings.

For each layer shape (LeNet-5 on digits, ResNet-20 stages on CIFAR-sized inputs) and each
TF_ENABLE_ONEDNN_OPTS setting (each in its own subprocess: the variable acts only before TensorFlow
is imported), the median time of one forward + backward pass (gradients for input and kernel) of:
  floor     one ordinary convolution on an N-times-larger batch (the same arithmetic, no groups)
  native    the grouped convolution with TensorFlow's own gradient (absent on CPUs without oneDNN)
  portable  the grouped convolution with bayes_keras' gradient made of forward convolutions
Timing is interleaved: every round runs each variant once, in shuffled order.

Usage: python benchmarks/grouped_conv.py [--rounds 40]
Writes benchmarks/results/grouped_conv.{json,md}.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time

import harness  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [  # name, batch, N, H, W, C, F, kernel, stride
    ("LeNet conv2 (digits), N=10", 64, 10, 4, 4, 6, 16, 5, 1),
    ("LeNet conv2 (digits), N=20", 64, 20, 4, 4, 6, 16, 5, 1),
    ("ResNet-20 stage 1, N=4", 32, 4, 32, 32, 16, 16, 3, 1),
    ("ResNet-20 stage 2 down, N=4", 32, 4, 32, 32, 16, 32, 3, 2),
    ("ResNet-20 stage 3, N=4", 32, 4, 8, 8, 64, 64, 3, 1),
]


def child(rounds):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    sys.path.insert(0, os.path.dirname(HERE))
    from bayes_keras.layers import grouped_convolution as gc

    def step_fn(conv):
        @tf.function
        def step(x, k, dy):
            with tf.GradientTape() as tape:
                tape.watch([x, k])
                y = conv(x, k)
            return tape.gradient(y, [x, k], output_gradients=dy)

        return step

    rows = []
    for name, b, n, h, w, c, f, ks, s in SHAPES:
        x, k = tf.random.normal((b, h, w, n * c)), tf.random.normal((ks, ks, c, n * f))
        xb, kb = tf.random.normal((b * n, h, w, c)), tf.random.normal((ks, ks, c, f))
        variants = {"floor": (lambda x, k: tf.nn.conv2d(x, k, s, "SAME"), xb, kb)}
        if gc.native_gradient_runs():
            variants["native"] = (lambda x, k: tf.nn.conv2d(x, k, s, "SAME"), x, k)
        variants["portable"] = (
            gc.portable_grouped_conv2d(
                lambda x, k: tf.nn.conv2d(x, k, s, "SAME"), n, (s, s), "SAME", (1, 1)
            ),
            x,
            k,
        )
        steps, times = {}, {v: [] for v in variants}
        for v, (conv, xi, ki) in variants.items():
            steps[v] = step_fn(conv)
            dy = tf.random.normal(conv(xi, ki).shape)
            steps[v] = (steps[v], xi, ki, dy)
            for _ in range(3):
                steps[v][0](xi, ki, dy)
        for _ in range(rounds):
            order = list(variants)
            random.shuffle(order)
            for v in order:
                fn, xi, ki, dy = steps[v]
                t0 = time.perf_counter()
                fn(xi, ki, dy)[0].numpy()
                times[v].append(time.perf_counter() - t0)
        rows.append({"shape": name, **{v: 1e3 * float(np.median(t)) for v, t in times.items()}})
    print(json.dumps(rows))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        return child(args.rounds)
    result = {"rounds": args.rounds, "settings": {}}
    for onednn in ("0", "1"):
        env = dict(
            os.environ,
            TF_ENABLE_ONEDNN_OPTS=onednn,
            TF_CPP_MIN_LOG_LEVEL="3",
            CUDA_VISIBLE_DEVICES="",
        )
        out = subprocess.run(
            [sys.executable, __file__, "--child", "--rounds", str(args.rounds)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        result["settings"][onednn] = json.loads(out.strip().splitlines()[-1])
    lines = [
        "# Particle convolution, forward + backward (ms, median)",
        "",
        f"{os.cpu_count()} CPU cores; {args.rounds} interleaved rounds. floor: one convolution on an N-times "
        "larger batch; native: TensorFlow's grouped gradient; portable: bayes_keras' gradient from forward "
        "convolutions.",
        "",
        "| layer | oneDNN | floor | native | portable | portable / floor |",
        "|---|---|---|---|---|---|",
    ]
    for onednn, rows in result["settings"].items():
        for r in rows:
            native = f"{r['native']:.2f}" if "native" in r else "no gradient"
            lines.append(
                f"| {r['shape']} | {'on' if onednn == '1' else 'off'} | {r['floor']:.2f} | {native} | "
                f"{r['portable']:.2f} | {r['portable'] / r['floor']:.2f} |"
            )
    lines += ["", "Command: `python benchmarks/grouped_conv.py`", ""]
    harness.save_results("grouped_conv", result, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
