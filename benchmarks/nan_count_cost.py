"""What counting NaN / Inf inputs costs the prediction methods (issue: the API's edges, "NaN / Inf inputs to
prediction counted and warned once per call, at <= 2% step-time cost").

`predict_particles` (and with it `predictive` and `uncertainty`) counts each batch's non-finite inputs in the graph
of its compiled forward pass; `predict` counts in-memory inputs once, with numpy, before the call (a dataset's are
seen in its NaN predictions).

- Step time: the compiled forward of one batch of 128 with the count (what predict_particles runs) and without it,
  timed side by side in one process: blocks of 50 calls, the two (and a control: the counted step again) in a
  shuffled order in each of 40 rounds after warm-up; the ratio of the medians. The control's ratio (the same step
  timed twice) is the noise of the measurement.
- predict's count: the time of the numpy pass over the inputs, as a fraction of the predict call's.

On the main job's model (bayes_keras.zoo.lenet5, 10 particles; the offline digits test set, 450 images) and a
64-256-256-10 MLP with 10 particles (10,000 rows).

Usage:
    python benchmarks/nan_count_cost.py
Writes benchmarks/results/nan_count_cost.{json,md}.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import bayes_keras as bk  # noqa: E402
from bayes_keras.training import call_checks  # noqa: E402
from bayes_keras.training import particle_predictor  # noqa: E402

import harness  # noqa: E402

ROUNDS, CALLS, BATCH = 40, 50, 128


def _models():
    keras.utils.set_random_seed(0)
    _, (x_digits, _) = bk.datasets.load_digits()
    lenet = bk.zoo.lenet5(num_particles=10, likelihood="categorical")
    mlp = bk.zoo.mlp(64, 10, (256, 256), num_particles=10, likelihood="categorical")
    x_mlp = np.random.default_rng(0).normal(size=(10_000, 64)).astype("float32")
    return {
        "lenet5, digits test set (450)": (lenet, x_digits),
        "mlp 64-256-256-10, 10,000 rows": (mlp, x_mlp),
    }


def _block(function, batch):
    start = time.perf_counter()
    for _ in range(CALLS):
        result = function(batch)
        np.asarray(result[0] if isinstance(result, tuple) else result)
        if isinstance(result, tuple):
            int(result[1])
    return (time.perf_counter() - start) / CALLS


def _median_time(call, repeats=15):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main():
    rows, rng = [], np.random.default_rng(0)
    for name, (model, x) in _models().items():
        batch = tf.constant(x[:BATCH])
        plain = particle_predictor.particle_function(model)
        counted = particle_predictor.particle_function(model, count_non_finite=True)
        for f in (plain, counted):
            _block(f, batch)
        order = [("counted", counted), ("not counted", plain), ("counted again", counted)]
        times = {label: [] for label, _ in order}
        for _ in range(ROUNDS):
            rng.shuffle(order)
            for label, function in order:
                times[label].append(_block(function, batch))
        median = {k: float(np.median(v)) for k, v in times.items()}
        model.predict(x, batch_size=BATCH, verbose=0)
        predict_s = _median_time(lambda: model.predict(x, batch_size=BATCH, verbose=0))
        count_s = _median_time(lambda: call_checks.non_finite_inputs(x, "predict"))
        rows.append(
            {
                "model": name,
                "step_counted_ms": 1e3 * median["counted"],
                "step_not_counted_ms": 1e3 * median["not counted"],
                "step_ratio": median["counted"] / median["not counted"],
                "control_ratio": median["counted"] / median["counted again"],
                "predict_s": predict_s,
                "predict_count_s": count_s,
                "predict_fraction": count_s / predict_s,
            }
        )
    lines = [
        "# Cost of counting NaN / Inf inputs in prediction (benchmarks/nan_count_cost.py)",
        "",
        f"Step: one batch of {BATCH} through the compiled forward pass, median over {ROUNDS} rounds of blocks of "
        f"{CALLS} calls (shuffled order in each round); control = the counted step against itself. predict: the "
        "numpy count over the inputs against the whole predict call (median of 15).",
        "",
        "| model | step, counted (ms) | step, not counted (ms) | step ratio | control | predict (s) | "
        "predict's count (s) | share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['model']} | {r['step_counted_ms']:.3f} | {r['step_not_counted_ms']:.3f} | {r['step_ratio']:.3f} | "
        f"{r['control_ratio']:.3f} | {r['predict_s']:.4f} | {r['predict_count_s']:.5f} | "
        f"{100 * r['predict_fraction']:.2f}% |"
        for r in rows
    ]
    harness.save_results("nan_count_cost", {"rows": rows, "machine": harness.machine_info()}, lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
