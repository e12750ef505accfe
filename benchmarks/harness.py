"""What every benchmark script shares: where results go, how they are written, the machine they ran on,
and the small measurements (first_reach) the reports are made of.

Each script writes results/<stem>.json (everything measured, with the command and the machine) and
results/<stem>.md (the table a reader looks at), through `save_results`.
"""

import datetime
import json
import os
import platform
import time

import keras
import numpy as np

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def save_results(stem, result, markdown, out=RESULTS_DIR, **json_options):
    """Write `result` to out/stem.json and `markdown` (a string, or a list of lines) to out/stem.md;
    returns the two paths."""
    os.makedirs(out, exist_ok=True)
    json_path, md_path = os.path.join(out, stem + ".json"), os.path.join(out, stem + ".md")
    options = {"indent": 2, **json_options}
    with open(json_path, "w") as f:
        json.dump(result, f, **options)
    if not isinstance(markdown, str):
        markdown = "\n".join(markdown)
    with open(md_path, "w") as f:
        f.write(markdown if markdown.endswith("\n") else markdown + "\n")
    return json_path, md_path


def first_reach(curve, level, higher_is_better=True, iterations=None):
    """The first point where `curve` reaches `level` (>= it when higher is better, <= otherwise; NaNs never
    reach): its index, or `iterations[index]` when given; None when it never does."""
    c = np.asarray(curve, dtype=np.float64)
    reached = np.isfinite(c) & ((c >= level) if higher_is_better else (c <= level))
    hits = np.nonzero(reached)[0]
    if not len(hits):
        return None
    return int(hits[0]) if iterations is None else int(np.asarray(iterations)[hits[0]])


def sync(logs):
    """Materialise one output so that a step has certainly finished (CPU execution is synchronous anyway)."""
    while isinstance(logs, (list, tuple)) and logs:
        logs = logs[-1]
    if isinstance(logs, dict) and logs:
        logs = next(iter(logs.values()))
    if hasattr(logs, "numpy"):
        logs.numpy()


def load_average():
    """1, 5 and 15 minute load averages (the machine may be shared), or None where unavailable."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def onednn_setting():
    """TF_ENABLE_ONEDNN_OPTS as this process saw it ("default" when unset: on for AVX-512-class x86)."""
    return {"0": "off", "1": "on"}.get(os.environ.get("TF_ENABLE_ONEDNN_OPTS"), "default")


def machine_info():
    """The machine and library versions a result was measured with."""
    import keras
    import tensorflow as tf
    import tensorflow_probability as tfp

    import bayes_keras as bk

    try:
        import tf_keras

        tf_keras_version = tf_keras.__version__
    except ImportError:
        tf_keras_version = None
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "tf_keras": tf_keras_version,
        "tensorflow_probability": tfp.__version__,
        "bayes_keras": bk.__version__,
        "load_average_1_5_15min": load_average(),
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "onednn": onednn_setting(),
    }


def interleaved_microseconds(fns, rounds, steps, rng, warmup=5):
    """Times zero-argument callables (each returning a list of tensors) in `rounds` rounds; in every round
    each runs a block of `steps` calls, the blocks back to back in shuffled order. Returns name -> list of
    microseconds per call, one per round, so that within-round ratios are paired."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name in rng.permutation(list(fns)):
            start = time.perf_counter()
            for _ in range(steps):
                out = fns[name]()
            out[0].numpy()
            times[name].append((time.perf_counter() - start) / steps * 1e6)
    return times


def paired_ratio(times, numerator, denominator):
    """Median over rounds of the within-round ratio of two variants' times."""
    return float(np.median(np.array(times[numerator]) / np.array(times[denominator])))


def hand_written_adam(variables, learning_rate=1e-3):
    """Adam for a list of tf.Variables, written out in TensorFlow ops: the floor benchmarks give both sides
    of a ratio (one weight set, N weight sets) the same update ops. Returns apply(grads)."""
    import tensorflow as tf

    slots = [(tf.Variable(tf.zeros_like(v)), tf.Variable(tf.zeros_like(v))) for v in variables]
    count = tf.Variable(0.0)

    def apply(grads):
        count.assign_add(1.0)
        scale = learning_rate * tf.sqrt(1.0 - 0.999**count) / (1.0 - 0.9**count)
        for v, g, (m, s) in zip(variables, grads, slots):
            m.assign(0.9 * m + 0.1 * g)
            s.assign(0.999 * s + 0.001 * tf.square(g))
            v.assign_sub(scale * m / (tf.sqrt(s) + 1e-7))

    return apply


def floor_arguments(description, rounds, steps):
    """The command line the floor benchmarks share: --particles, --rounds, --steps, --seed."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--particles", type=int, nargs="+", default=[5, 10, 20])
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def floor_rows(variants, args, ratios):
    """One row per particle count: `variants(n, rng)`'s callables timed by `interleaved_microseconds`,
    their medians and `ratios(times)` (paired ratios: within a round the variants ran back to back)."""
    rng = np.random.default_rng(args.seed)
    rows = []
    for n in args.particles:
        times = interleaved_microseconds(variants(n, rng), args.rounds, args.steps, rng)
        median = {k: float(np.median(v)) for k, v in times.items()}
        ratio = ratios(times)
        rows.append({"num_particles": n, "median_us": median, "ratio": ratio})
        shown = (
            {k: round(v, 2) for k, v in ratio.items()}
            if isinstance(ratio, dict)
            else round(ratio, 2)
        )
        print(n, {k: round(v, 1) for k, v in median.items()}, shown, flush=True)
    return rows


def gradient_pass(loss, variables):
    """A compiled zero-argument callable: forward + backward of `loss()`, returning the gradients."""
    import tensorflow as tf

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            value = loss()
        return tape.gradient(value, variables)

    return step


def training_step(loss, variables):
    """A compiled zero-argument callable: `gradient_pass` plus a `hand_written_adam` update of `variables`."""
    import tensorflow as tf

    adam = hand_written_adam(variables)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            value = loss()
        adam(tape.gradient(value, variables))
        return [value]

    return step


def refresh_keras_batch_norm(model, x, batch_size=64):
    """A plain Keras model's BatchNormalization moving statistics recomputed for its current weights as
    `BayesianModel.refresh_batch_norm` does for particle networks (each batch's statistics averaged with its
    size as weight; training-mode passes, weights unchanged), so that comparisons treat both sides alike."""
    layers = [
        layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)
    ]  # flat models
    momenta = [layer.momentum for layer in layers]
    try:
        seen = 0
        for start in range(0, len(x), batch_size):
            count = len(x[start : start + batch_size])
            for (
                layer
            ) in layers:  # the running average of the batches so far, weighted by their sizes
                layer.momentum = seen / (seen + count)
            model(x[start : start + batch_size], training=True)
            seen += count
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
