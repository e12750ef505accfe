"""One script for one device, several devices, and several machines: a Bayesian LeNet-5 (GPF) on the
offline digits under tf.distribute.

    python examples/distributed_lenet.py                  # every GPU of this machine, else the CPU
    python examples/distributed_lenet.py --cpu-devices 2  # the CPU split in 2 logical devices (a try-out:
                                                          # they share the cores, so no speed-up)
    # Several machines (or processes): the same command on each, with its TF_CONFIG, e.g. on localhost:
    TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}, "task": {"type": "worker", "index": 0}}' \\
        python examples/distributed_lenet.py &
    TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}, "task": {"type": "worker", "index": 1}}' \\
        python examples/distributed_lenet.py

With TF_CONFIG set, a MultiWorkerMirroredStrategy joins the workers (each may have several GPUs);
otherwise a MirroredStrategy spans this machine's devices. `--batch` is the global batch: every step
sees the same examples whatever the number of replicas, and the result equals one device's
(docs/distributed.md).
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402


def strategy_for(cpu_devices):
    """MultiWorkerMirroredStrategy under TF_CONFIG, else MirroredStrategy over this machine's devices."""
    if "TF_CONFIG" in os.environ:
        return tf.distribute.MultiWorkerMirroredStrategy()  # must be created before any other TF op
    if cpu_devices > 1:  # before TensorFlow initialises its devices
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * cpu_devices
        )
        return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(cpu_devices)])
    return tf.distribute.MirroredStrategy()  # every GPU, or the CPU when there is none


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--particles", type=int, default=8)
    args = parser.parse_args()
    strategy = strategy_for(args.cpu_devices)

    import keras
    import bayes_keras as bk

    (x_train, y_train), (x_test, y_test) = bk.datasets.load_digits(test_fraction=0.25, seed=0)
    keras.utils.set_random_seed(0)
    with (
        strategy.scope()
    ):  # the model, its optimizer state and metrics are mirrored on every replica
        model = bk.zoo.lenet5(x_train.shape[1:], 10, num_particles=args.particles)
        steps = args.epochs * -(-len(x_train) // args.batch)
        schedule = keras.optimizers.schedules.CosineDecay(3e-3, steps)
        model.compile(
            optimizer=bk.optimizers.GaussianParticleFlow(schedule, structure="layer"),
            metrics=["accuracy"],
        )
    model.fit(x_train, y_train, batch_size=args.batch, epochs=args.epochs, verbose=0)
    scores = bk.metrics.evaluate_probs(
        model.predict(x_test, batch_size=args.batch, verbose=0), y_test
    )
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    who = f"worker {task['index']}, " if task else ""
    print(
        f"Bayesian LeNet-5 (GPF, {args.particles} particles) on {who}{strategy.num_replicas_in_sync} replica(s): "
        + ", ".join(f"{k} {v:.4f}" for k, v in scores.items())
    )


if __name__ == "__main__":
    main()
