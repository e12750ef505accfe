"""The size guard's estimate against the memory a particle layer really takes while it is built (issue: the API's
edges; a trial found a peak of 6x the weights at 10^5 particles against the guard's 3x).

Each configuration is built in a fresh subprocess: a bayes_keras.layers.Dense (or Conv2D) with N particles called on
a keras.Input, while a thread samples the process's resident memory (VmRSS) every millisecond. The peak above the
resident memory just before the build, divided by the bytes of the layer's particle weights, is the headroom
the guard must assume (bayes_keras.layers.particle_initializers.DRAW_HEADROOM); the guard refuses a layer when headroom x weights
exceeds physical memory.

Usage:
    python benchmarks/size_guard_peaks.py
Writes benchmarks/results/size_guard_peaks.{json,md}.
"""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CONFIGS = [  # (layer, particles, per-particle shape)
    ("Dense", 1_000, {"units": 40, "inputs": 30}),
    ("Dense", 4_000, {"units": 40, "inputs": 30}),  # the last particle count drawn one by one
    ("Dense", 10_000, {"units": 40, "inputs": 30}),
    ("Dense", 100_000, {"units": 40, "inputs": 30}),
    ("Dense", 10, {"units": 1000, "inputs": 1000}),
    ("Dense", 100, {"units": 1000, "inputs": 1000}),
    ("Conv2D", 1_000, {"filters": 64, "channels": 64}),
    ("Conv2D", 20_000, {"filters": 16, "channels": 16}),
]

# What both children run first: the imports and peak_during(call), the largest resident memory while `call` runs
# (VmRSS sampled every millisecond by a thread), above the resident memory before it.
PEAK = r"""
import os, sys, threading, time, json
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import keras, numpy as np
import bayes_keras as bk

def rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

def peak_during(call):
    peak, done = [rss()], [False]
    before = peak[0]
    def watch():
        while not done[0]:
            peak[0] = max(peak[0], rss())
            time.sleep(0.001)
    thread = threading.Thread(target=watch)
    thread.start()
    call()
    done[0] = True
    thread.join()
    return before, max(peak[0], rss())
"""

CHILD = (
    PEAK
    + r"""
layer, n, spec = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
if layer == "Dense":
    inputs = keras.Input((spec["inputs"],))
    make = lambda: bk.layers.Dense(spec["units"], num_particles=n)
else:
    inputs = keras.Input((8, 8, spec["channels"]))
    make = lambda: bk.layers.Conv2D(spec["filters"], 3, padding="same", num_particles=n)
created = make()
before, peak = peak_during(lambda: created(inputs))
weights = sum(int(np.prod(v.shape)) * 4 for v in created.weights)
print(json.dumps({"before": before, "peak": peak, "after": rss(), "weights": weights}))
"""
)


STEP_CONFIGS = [  # (method, particles, inputs, units): weights-dominated, then two sizes of N^2 growth
    *[(m, 100, 1000, 1000) for m in ("gpf", "mgvbp", "independent", "svgd", "matrix_svgd")],
    *[(m, n, 30, 40) for m in ("gpf", "independent", "svgd", "matrix_svgd") for n in (2000, 4000)],
]

STEP_CHILD = (
    PEAK
    + r"""
method, n, width, units = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])

x = np.random.default_rng(0).normal(size=(64, width)).astype("float32")
y = np.zeros(64, "int32")
inputs = keras.Input((width,))
model = bk.BayesianModel(inputs, bk.layers.Dense(units, num_particles=n)(inputs), likelihood="categorical")
optimizer = {"gpf": bk.optimizers.GaussianParticleFlow, "independent": bk.optimizers.IndependentParticles,
             "mgvbp": lambda: bk.optimizers.MGVBP(structure="diagonal"), "svgd": bk.optimizers.SVGD,
             "matrix_svgd": bk.optimizers.MatrixSVGD}[method]()
model.compile(optimizer=optimizer)
before, peak = peak_during(lambda: model.fit(x, y, batch_size=64, epochs=1, verbose=0))
weights = sum(int(np.prod(v.shape)) * 4 for v in model.particle_variables)
print(json.dumps({"before": before, "peak": peak, "weights": weights}))
"""
)


def _run(child, *args):
    """The JSON line a child script prints, run in a fresh process (its memory is the measured layer's alone)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run(
        [sys.executable, "-c", child, *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_step(method, n, width, units):
    return _run(STEP_CHILD, method, n, width, units)


def measure(layer, n, spec):
    return _run(CHILD, layer, n, json.dumps(spec))


def main():
    import harness

    rows = []
    for layer, n, spec in CONFIGS:
        m = measure(layer, n, spec)
        rows.append(
            {
                "layer": layer,
                "particles": n,
                **spec,
                **m,
                "peak_over_weights": (m["peak"] - m["before"]) / m["weights"],
                "kept_over_weights": (m["after"] - m["before"]) / m["weights"],
            }
        )
        print(rows[-1], flush=True)
    steps = []
    for method, n, width, units in STEP_CONFIGS:
        m = measure_step(method, n, width, units)
        steps.append(
            {
                "method": method,
                "particles": n,
                "inputs": width,
                "units": units,
                **m,
                "peak_mb": (m["peak"] - m["before"]) / 2**20,
                "peak_over_weights": (m["peak"] - m["before"]) / m["weights"],
            }
        )
        print(steps[-1], flush=True)
    worst = max(r["peak_over_weights"] for r in rows)
    lines = [
        "# The size guard's headroom against measured peaks (benchmarks/size_guard_peaks.py)",
        "",
        "Peak resident memory while the layer is built, above the memory just before, per byte of its weights "
        f"(float32). Worst: {worst:.2f}x.",
        "",
        "| layer | particles | per particle | weights (MB) | peak / weights | kept / weights |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        shape = (
            f"{r['inputs']} -> {r['units']}"
            if r["layer"] == "Dense"
            else f"3x3, {r['channels']} -> {r['filters']}"
        )
        lines.append(
            f"| {r['layer']} | {r['particles']:,} | {shape} | {r['weights'] / 2**20:.1f} | "
            f"{r['peak_over_weights']:.2f} | {r['kept_over_weights']:.2f} |"
        )
    lines += [
        "",
        "The first training step (fit, one batch of 64; the traced graph included), peak resident memory above "
        "the memory before fit. Weights-dominated rows (1000 -> 1000, 100 particles) give the per-weight "
        "headroom of the step (the guard: 10x, MatrixSVGD 18x); the two particle counts of the small layer give "
        "the growth with N^2, beyond IndependentParticles' growth (the guard: N x N tensors per method, "
        "GaussianParticleFlow 3, SVGD 16, MatrixSVGD 16).",
        "",
        "| method | particles | layer | weights (MB) | N^2 x 4 bytes (MB) | peak (MB) | peak / weights |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in steps:
        lines.append(
            f"| {r['method']} | {r['particles']:,} | {r['inputs']} -> {r['units']} | "
            f"{r['weights'] / 2**20:.1f} | {4 * r['particles'] ** 2 / 2**20:.0f} | {r['peak_mb']:.0f} | "
            f"{r['peak_over_weights']:.2f} |"
        )
    harness.save_results(
        "size_guard_peaks", {"rows": rows, "steps": steps, "machine": harness.machine_info()}, lines
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
