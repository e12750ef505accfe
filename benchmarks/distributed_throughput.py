"""Examples per second of data-parallel training on 1 vs 2 logical devices, particle parallel against data
parallel, and a model on paper of the scaling of ResNet-20 with 8 particles to 8 GPUs.

Measured: GPF (per-layer blocks) training steps of LeNet-5 (8x8x1 digits, N = 8) and ResNet-20 (32x32x3,
N = 4 and 8, random pixels: the arithmetic does not depend on them), under a MirroredStrategy over one
and over two logical CPU devices, in ONE process, rounds interleaved (each round times a block of steps
of every variant, in shuffled order). A step is `model.train_function` on a repeated in-memory batch
(the way fit drives it), after a warm-up; the same global batch on 1 and 2 devices. The logical devices
SHARE this machine's cores: two of them do not add compute, so this measures what the replication and
its all-reduces cost, not a speed-up; a speed-up needs devices with their own compute (GPUs).

Particle parallel vs data parallel: LeNet-5 with N = 4, 8, 16 on 2 logical devices, each way, timed in
the same rounds, with the activation bytes each device holds, computed from the layers' output shapes
(CPU devices report no memory use): data parallel holds B / 2 examples x N particles, particle parallel
B examples x N / 2 particles (plus the whole batch's inputs).

On paper (no cluster here): bytes all-reduced per step and compute per step of ResNet-20 with 8
particles, from the model's own parameter count and its convolutions' multiply-adds, on 1-8 GPUs at a
stated sustained throughput and all-reduce bandwidth.

    python benchmarks/distributed_throughput.py [--rounds 5] [--steps 5]
Writes benchmarks/results/distributed_throughput.{json,md}.
"""

import argparse
import os
import random
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

_CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(_CPU, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402

import bayes_keras as bk  # noqa: E402

MODELS = {
    "LeNet-5 (N=8)": ((8, 8, 1), lambda: bk.zoo.lenet5((8, 8, 1), 10, num_particles=8), 64),
    "ResNet-20 (N=4)": ((32, 32, 3), lambda: bk.zoo.resnet20((32, 32, 3), 10, num_particles=4), 32),
    "ResNet-20 (N=8)": ((32, 32, 3), lambda: bk.zoo.resnet20((32, 32, 3), 10, num_particles=8), 32),
}


_STRATEGIES = {}  # one per device count: strategies over the same devices in one process share collectives


def variant(model_name, devices, parallel="data", particles=None):
    shape, make, batch = MODELS[model_name]
    if devices not in _STRATEGIES:
        _STRATEGIES[devices] = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(devices)])
    strategy = _STRATEGIES[devices]
    rng = np.random.default_rng(0)
    x = rng.random((batch,) + shape).astype("float32")
    y = rng.integers(0, 10, batch)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = make() if particles is None else bk.zoo.lenet5(shape, 10, num_particles=particles)
        model.compile(
            optimizer=bk.optimizers.GaussianParticleFlow(
                1e-3, structure="layer", step_rule="rmsprop"
            ),
            dataset_size=50000,
            parallel=parallel,
        )
    model.fit(x, y, batch_size=batch, epochs=1, verbose=0)  # builds and traces the train function
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    def run(steps):
        for _ in range(steps):
            logs = model.train_function(iterator)
        float(np.mean(np.asarray(logs["loss"])))  # wait for the last step

    run(3)
    return run, batch


def interleaved(runs, rounds, steps, rng):
    """Per-step seconds of every run, rounds interleaved in shuffled order."""
    times = {key: [] for key in runs}
    for _ in range(rounds):
        order = list(runs)
        rng.shuffle(order)
        for key in order:
            start = time.perf_counter()
            runs[key](steps)
            times[key].append((time.perf_counter() - start) / steps)
    return times


def activation_bytes_per_example(particles):
    """Bytes of every layer output of LeNet-5 (8x8x1) with `particles` particles, for one example (float32)."""
    keras.utils.set_random_seed(0)
    model = bk.zoo.lenet5((8, 8, 1), 10, num_particles=particles)
    probe = keras.Model(model.inputs, [layer.output for layer in model.layers[1:]])
    return sum(int(np.prod(o.shape[1:])) * 4 for o in probe([np.zeros((1, 8, 8, 1), "float32")]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--particle-counts", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--out", default=harness.RESULTS_DIR)
    args = parser.parse_args()
    rng = random.Random(0)
    rows, lines = [], []
    for name in args.models:
        runs = {d: variant(name, d) for d in (1, 2)}
        batch = runs[1][1]
        times = interleaved({d: r[0] for d, r in runs.items()}, args.rounds, args.steps, rng)
        ratios = [b / a for a, b in zip(times[1], times[2])]
        row = {
            "model": name,
            "global_batch": batch,
            "examples_per_second_1_device": batch / statistics.median(times[1]),
            "examples_per_second_2_devices": batch / statistics.median(times[2]),
            "step_time_ratio_2_over_1": statistics.median(ratios),
            "step_seconds": {str(d): times[d] for d in times},
        }
        rows.append(row)
        print(
            f"{name}: {row['examples_per_second_1_device']:.0f} examples/s on 1 logical device, "
            f"{row['examples_per_second_2_devices']:.0f} on 2 (step time ratio {row['step_time_ratio_2_over_1']:.2f})",
            flush=True,
        )
    parallel_rows = []
    for n in args.particle_counts:
        runs = {
            "data": variant("LeNet-5 (N=8)", 2, "data", n)[0],
            "particles": variant("LeNet-5 (N=8)", 2, "particles", n)[0],
        }
        batch = MODELS["LeNet-5 (N=8)"][2]
        times = interleaved(runs, args.rounds, args.steps, rng)
        full, half = activation_bytes_per_example(n), activation_bytes_per_example(n // 2)
        row = {
            "particles": n,
            "global_batch": batch,
            "data_parallel_step_ms": 1e3 * statistics.median(times["data"]),
            "particle_parallel_step_ms": 1e3 * statistics.median(times["particles"]),
            "particle_over_data": statistics.median(
                [p / d for p, d in zip(times["particles"], times["data"])]
            ),
            "data_parallel_activation_bytes_per_device": batch // 2 * full,
            "particle_parallel_activation_bytes_per_device": batch * half + batch * 8 * 8 * 4,
        }
        parallel_rows.append(row)
        print(
            f"LeNet-5 N={n}: data parallel {row['data_parallel_step_ms']:.1f} ms, particle parallel "
            f"{row['particle_parallel_step_ms']:.1f} ms (ratio {row['particle_over_data']:.2f})",
            flush=True,
        )
    paper = scaling_on_paper()
    lines += [
        "# Data-parallel throughput: 1 vs 2 logical CPU devices (shared cores)",
        "",
        "GPF (per-layer blocks), the same global batch on 1 and 2 devices, one process, rounds interleaved. "
        "The two logical devices share the machine's cores: this measures what replication and its "
        "all-reduces cost, not a speed-up.",
        "",
        "| model | global batch | examples/s, 1 device | examples/s, 2 devices | step time 2 / 1 (paired median) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['global_batch']} | {r['examples_per_second_1_device']:.0f} | "
            f"{r['examples_per_second_2_devices']:.0f} | {r['step_time_ratio_2_over_1']:.2f} |"
        )
    lines += [
        "",
        "# Particle parallel vs data parallel, LeNet-5 on 2 logical CPU devices (shared cores)",
        "",
        f"GPF (per-layer blocks), global batch {MODELS['LeNet-5 (N=8)'][2]}; activation bytes per device from "
        "the layers' output shapes (float32, forward outputs; CPU devices report no memory use).",
        "",
        "| N | data parallel step (ms) | particle parallel step (ms) | particle / data (paired median) | "
        "activations per device, data parallel | particle parallel |",
        "|---|---|---|---|---|---|",
    ]
    for r in parallel_rows:
        lines.append(
            f"| {r['particles']} | {r['data_parallel_step_ms']:.1f} | {r['particle_parallel_step_ms']:.1f} | "
            f"{r['particle_over_data']:.2f} | {r['data_parallel_activation_bytes_per_device'] / 1e6:.2f} MB | "
            f"{r['particle_parallel_activation_bytes_per_device'] / 1e6:.2f} MB |"
        )
    lines += [
        "",
        "# On paper: ResNet-20 with 8 particles on 1-8 GPUs (data parallel)",
        "",
        paper["assumptions"],
        "",
        "| GPUs | examples per GPU | compute per GPU (ms) | all-reduce per GPU (ms) | step (ms, no overlap) | "
        "speed-up |",
        "|---|---|---|---|---|---|",
    ]
    for g in paper["rows"]:
        lines.append(
            f"| {g['gpus']} | {g['examples_per_gpu']} | {g['compute_ms']:.2f} | {g['allreduce_ms']:.3f} | "
            f"{g['step_ms']:.2f} | {g['speedup']:.2f} |"
        )
    result = {
        "command": " ".join(sys.argv),
        "machine": harness.machine_info(),
        "rows": rows,
        "particle_parallel": parallel_rows,
        "on_paper": paper,
    }
    for path in harness.save_results("distributed_throughput", result, lines, out=args.out):
        print("wrote", path)


def conv_multiply_adds(model, shape):
    """Multiply-adds of one forward pass of ONE particle on one example: every Conv2D and Dense layer's
    output positions x kernel size x input channels x filters (from the layers' built shapes)."""
    total = 0
    probe = keras.Model(
        model.inputs,
        [
            layer.output
            for layer in model.layers
            if isinstance(layer, (bk.layers.Conv2D, bk.layers.Dense))
        ],
    )
    outputs = probe([np.zeros((1,) + shape, "float32")])
    layers = [
        layer for layer in model.layers if isinstance(layer, (bk.layers.Conv2D, bk.layers.Dense))
    ]
    for layer, out in zip(layers, outputs):
        kernel = layer.kernel.shape[1:] if not layer.deterministic else layer.kernel.shape
        positions = (
            int(np.prod(out.shape[1:-1])) // layer.num_particles
        )  # (1, H, W, N, F) or (1, N, F)
        total += positions * int(np.prod(kernel))
    return total


def scaling_on_paper(batch=128, particles=8, tflops=20.0, bandwidth_gb=100.0):
    """Ring all-reduce of the gradients (2 (G-1)/G of the bytes through each GPU's link) and the compute of
    forward + backward (3x the forward's multiply-adds, 2 FLOPs each), no overlap of the two."""
    keras.utils.set_random_seed(0)
    model = bk.zoo.resnet20((32, 32, 3), 10, num_particles=particles)
    macs = conv_multiply_adds(model, (32, 32, 3))
    gradient_bytes = sum(int(np.prod(v.shape)) for v in model.trainable_variables) * 4
    flops_per_example = 3 * 2 * macs * particles
    rows = []
    base = None
    for gpus in (1, 2, 4, 8):
        per_gpu = batch // gpus
        compute_ms = per_gpu * flops_per_example / (tflops * 1e12) * 1e3
        allreduce_ms = (
            0.0
            if gpus == 1
            else 2 * (gpus - 1) / gpus * gradient_bytes / (bandwidth_gb * 1e9) * 1e3
        )
        step = compute_ms + allreduce_ms
        base = base or step
        rows.append(
            {
                "gpus": gpus,
                "examples_per_gpu": per_gpu,
                "compute_ms": compute_ms,
                "allreduce_ms": allreduce_ms,
                "step_ms": step,
                "speedup": base / step,
            }
        )
    assumptions = (
        f"Global batch {batch}; ResNet-20 has {gradient_bytes / 4 / particles / 1e3:.0f}k weights per "
        f"particle, so {gradient_bytes / 1e6:.1f} MB of float32 gradients are all-reduced per step (plus "
        f"{particles} log likelihoods and the BatchNormalization sums, negligible); forward "
        f"{macs / 1e6:.1f} M multiply-adds per example and particle, forward + backward "
        f"{flops_per_example / 1e9:.2f} GFLOP per example for the {particles} particles. Assumed: "
        f"{tflops:.0f} TFLOP/s sustained per GPU on these small grouped convolutions, {bandwidth_gb:.0f} GB/s "
        "all-reduce bandwidth per GPU (NVLink-class; PCIe 4.0 x16 gives about 25), no overlap of "
        "communication and compute (an upper bound on the step)."
    )
    return {
        "batch": batch,
        "particles": particles,
        "tflops": tflops,
        "bandwidth_gb_per_s": bandwidth_gb,
        "gradient_bytes": gradient_bytes,
        "forward_multiply_adds": macs,
        "rows": rows,
        "assumptions": assumptions,
    }


if __name__ == "__main__":
    main()
