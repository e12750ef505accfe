"""Trains each optimizer on one device and under a 2-replica MirroredStrategy (2 logical CPU devices) on
the same global batches, and prints a JSON line per run with the largest difference of every model and
optimizer variable, of the fit history, of predict and of evaluate, and whether the replicas' copies
of every variable are identical. Run in a subprocess: the CPU is split before TensorFlow initialises.

    python tests/scripts/distributed_check.py [--loop=fit|custom] [name ...]   # all runs when no name is given
"""

import json
import sys

import keras
import numpy as np
import tensorflow as tf

import bayes_keras as bk

N, BATCH, STEPS = 3, 16, 3


def sequence_model(likelihood, outputs, n=N):
    """LSTM with input and recurrent dropout, a synchronized particle BatchNormalization, Dense."""
    inputs = keras.Input((5, 4))
    h = bk.layers.LSTM(6, dropout=0.2, recurrent_dropout=0.2, num_particles=n, seed=3)(inputs)
    h = bk.layers.BatchNormalization(synchronized=True)(h)
    h = bk.layers.Activation("tanh")(h)
    return bk.BayesianModel(inputs, bk.layers.Dense(outputs)(h), likelihood=likelihood)


def image_model(likelihood, outputs, normalization=True, n=N):
    inputs = keras.Input((6, 6, 1))
    # No bias before a normalisation (its gradient is zero but for rounding, which the comparison would see).
    h = bk.layers.Conv2D(3, 3, num_particles=n, use_bias=not normalization)(inputs)
    if normalization:  # (MGVBP's Kronecker structure takes Dense and Conv2D layers only)
        h = bk.layers.BatchNormalization(synchronized=True)(h)
    h = bk.layers.Activation("relu")(h)
    h = bk.layers.Flatten()(h)
    return bk.BayesianModel(inputs, bk.layers.Dense(outputs)(h), likelihood=likelihood)


def lora_model(likelihood, outputs, n=N):
    """Bayesian LoRA converted from a Keras transformer: a frozen Dense before the particle axis (run once per
    example), rank-2 particle factors on the attention's query / value, a particle head."""
    inputs = keras.Input((5, 4))
    h = keras.layers.Dense(8, name="embed")(inputs)
    h = h + keras.layers.MultiHeadAttention(2, 4, name="attention")(h, h)
    h = keras.layers.GlobalAveragePooling1D()(h)
    keras_model = keras.Model(inputs, keras.layers.Dense(outputs, name="head")(h))
    return bk.bayesianize(keras_model, num_particles=n, lora_rank=2, likelihood=likelihood, seed=3)


def random_model(likelihood, outputs, n=N):
    """Random layers everywhere: input noise before the particle axis (drawn per example), dropout, Gaussian
    dropout and noise on particle activations (drawn per example and particle)."""
    inputs = keras.Input((6, 6, 1))
    h = bk.layers.GaussianNoise(0.3, seed=1)(inputs)
    h = bk.layers.Conv2D(3, 3, num_particles=n, activation="relu")(h)
    h = bk.layers.Dropout(0.3, seed=2)(h)
    h = bk.layers.Flatten()(h)
    h = bk.layers.GaussianDropout(0.2, seed=3)(h)
    h = bk.layers.GaussianNoise(0.1, seed=4)(h)
    return bk.BayesianModel(inputs, bk.layers.Dense(outputs)(h), likelihood=likelihood)


def converted_random_model(likelihood, outputs, n=N):
    """A Keras model with Keras' own random layers, converted by bayesianize (which draws them as one device):
    input noise, spatial dropout, dropout with and without a noise shape, alpha and Gaussian dropout."""
    inputs = keras.Input((6, 6, 1))
    h = keras.layers.GaussianNoise(0.3)(inputs)
    h = keras.layers.Conv2D(3, 3, activation="relu")(h)
    h = keras.layers.SpatialDropout2D(0.3)(h)
    h = keras.layers.Dropout(0.3)(h)
    h = keras.layers.Dropout(0.2, noise_shape=(None, 1, 4, 3))(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.AlphaDropout(0.1)(h)
    h = keras.layers.GaussianDropout(0.2)(h)
    keras_model = keras.Model(inputs, keras.layers.Dense(outputs)(h))
    return bk.bayesianize(keras_model, num_particles=n, likelihood=likelihood, seed=3)


def kfac():
    return bk.preconditioners.KFACPreconditioner(damping=1e-2, inversion_period=2)


# name: (model, likelihood, optimizer, metrics)
RUNS = {
    "gpf": (
        "sequence",
        "categorical",
        lambda: bk.optimizers.GaussianParticleFlow(1e-2),
        ["accuracy"],
    ),
    "gpf_layer_image": (
        "image",
        "categorical",
        lambda: bk.optimizers.GaussianParticleFlow(1e-2, structure="layer"),
        ["accuracy"],
    ),
    "svgd": ("sequence", "categorical", lambda: bk.optimizers.SVGD(1e-2), ["accuracy"]),
    "svgd_heteroscedastic": (
        "image",
        "heteroscedastic_normal",
        lambda: bk.optimizers.SVGD(1e-2),
        ["mae"],
    ),
    "matrix_svgd_kfac": (
        "image",
        "categorical",
        lambda: bk.optimizers.MatrixSVGD(0.1, preconditioner=kfac()),
        [],
    ),
    "matrix_svgd_kfac_sequence": (
        "sequence",
        "categorical",
        lambda: bk.optimizers.MatrixSVGD(0.1, preconditioner=kfac()),
        [],
    ),
    "independent_particles": (
        "sequence",
        "bernoulli",
        lambda: bk.optimizers.IndependentParticles(1e-2),
        ["accuracy"],
    ),
    "preconditioned_particles": (
        "image",
        "categorical",
        lambda: bk.optimizers.PreconditionedParticles(0.03, preconditioner=kfac()),
        [],
    ),
    "mgvbp_diagonal_stein": (
        "sequence",
        "categorical",
        lambda: bk.optimizers.MGVBP(1e-2, structure="diagonal", seed=5),
        ["accuracy"],
    ),
    "mgvbp_full": (
        "image",
        "categorical",
        lambda: bk.optimizers.MGVBP(1e-2, structure="full", seed=5),
        [],
    ),
    "mgvbp_layer": (
        "image",
        "categorical",
        lambda: bk.optimizers.MGVBP(1e-2, structure="layer", seed=5),
        [],
    ),
    "mgvbp_kronecker_empirical_fisher": (
        "image",
        "categorical",
        lambda: bk.optimizers.MGVBP(
            1e-2, structure="kronecker", curvature="empirical_fisher", seed=5
        ),
        [],
        {"normalization": False},
    ),
    "mgvbp_diagonal_fisher": (
        "image",
        "categorical",
        lambda: bk.optimizers.MGVBP(1e-2, structure="diagonal", curvature="fisher", seed=5),
        [],
    ),
    "mean_field_vi": (
        "sequence",
        "normal",
        lambda: bk.optimizers.MeanFieldVI(1e-2, seed=5),
        ["mae", lambda: bk.metrics.IntervalCoverage()],
    ),
    "keras_adam": ("image", "categorical", lambda: keras.optimizers.Adam(1e-2), ["accuracy"]),
    # particle parallel: each replica computes half of the particles on the whole batch
    "gpf_particle_parallel": (
        "sequence",
        "categorical",
        lambda: bk.optimizers.GaussianParticleFlow(1e-2),
        ["accuracy"],
        {"parallel": "particles", "particles": 4},
    ),
    "independent_particles_particle_parallel": (
        "image",
        "categorical",
        lambda: bk.optimizers.IndependentParticles(1e-2),
        ["accuracy"],
        {"parallel": "particles", "particles": 4},
    ),
    # Bayesian LoRA of a converted transformer (frozen prefix, the particle axis starting inside the attention)
    "gpf_lora": (
        "lora",
        "categorical",
        lambda: bk.optimizers.GaussianParticleFlow(1e-2),
        ["accuracy"],
    ),
    "gpf_lora_particle_parallel": (
        "lora",
        "categorical",
        lambda: bk.optimizers.GaussianParticleFlow(1e-2),
        ["accuracy"],
        {"parallel": "particles", "particles": 4},
    ),
    # random layers (dropout, Gaussian dropout and noise, before and after the particle axis; built by hand and
    # converted from Keras' own): the masks one device draws, under data and particle parallelism
    "gpf_random": (
        "random",
        "categorical",
        lambda: bk.optimizers.GaussianParticleFlow(1e-2),
        ["accuracy"],
    ),
    "independent_random": (
        "random",
        "categorical",
        lambda: bk.optimizers.IndependentParticles(1e-2),
        [],
    ),
    "mgvbp_random": (
        "random",
        "categorical",
        lambda: bk.optimizers.MGVBP(1e-2, structure="diagonal", seed=5),
        [],
    ),
    "gpf_random_particle_parallel": (
        "random",
        "categorical",
        lambda: bk.optimizers.GaussianParticleFlow(1e-2),
        [],
        {"parallel": "particles", "particles": 4},
    ),
    "independent_random_particle_parallel": (
        "random",
        "categorical",
        lambda: bk.optimizers.IndependentParticles(1e-2),
        [],
        {"parallel": "particles", "particles": 4},
    ),
    "mgvbp_random_particle_parallel": (
        "random",
        "categorical",
        lambda: bk.optimizers.MGVBP(1e-2, structure="diagonal", seed=5),
        [],
        {"parallel": "particles", "particles": 4},
    ),
    "gpf_converted_random": (
        "converted_random",
        "categorical",
        lambda: bk.optimizers.GaussianParticleFlow(1e-2),
        [],
    ),
    "gpf_converted_random_particle_parallel": (
        "converted_random",
        "categorical",
        lambda: bk.optimizers.GaussianParticleFlow(1e-2),
        [],
        {"parallel": "particles", "particles": 4},
    ),
    "independent_converted_random": (
        "converted_random",
        "categorical",
        lambda: bk.optimizers.IndependentParticles(1e-2),
        [],
    ),
    "mgvbp_converted_random": (
        "converted_random",
        "categorical",
        lambda: bk.optimizers.MGVBP(1e-2, structure="diagonal", seed=5),
        [],
    ),
    "independent_converted_random_particle_parallel": (
        "converted_random",
        "categorical",
        lambda: bk.optimizers.IndependentParticles(1e-2),
        [],
        {"parallel": "particles", "particles": 4},
    ),
    "mgvbp_converted_random_particle_parallel": (
        "converted_random",
        "categorical",
        lambda: bk.optimizers.MGVBP(1e-2, structure="diagonal", seed=5),
        [],
        {"parallel": "particles", "particles": 4},
    ),
    # float16 compute with the model's dynamic loss scaling (its decision is one for all replicas too)
    "gpf_mixed_float16": (
        "image",
        "categorical",
        lambda: bk.optimizers.GaussianParticleFlow(1e-2, structure="layer"),
        ["accuracy"],
        {"policy": "mixed_float16"},
    ),
}


def options(name):
    return RUNS[name][4] if len(RUNS[name]) > 4 else {}


def data(model_kind, likelihood, count=BATCH * STEPS):
    rng = np.random.default_rng(0)
    x = rng.normal(
        size=(count, 6, 6, 1)
        if model_kind in ("image", "random", "converted_random")
        else (count, 5, 4)
    ).astype("float32")
    if likelihood == "categorical":
        y = rng.integers(0, 3, count)
    elif likelihood == "bernoulli":
        y = rng.integers(0, 2, count).astype("float32")
    else:
        y = rng.normal(size=count).astype("float32")
    return x, y


def build(name):
    kind, likelihood, optimizer, metrics = RUNS[name][:4]
    keras.utils.set_random_seed(7)
    outputs = {"categorical": 3, "bernoulli": 1, "normal": 1, "heteroscedastic_normal": 2}[
        likelihood
    ]
    n = options(name).get("particles", N)
    if kind == "sequence":
        model = sequence_model(likelihood, outputs, n=n)
    elif kind == "lora":
        model = lora_model(likelihood, outputs, n=n)
    elif kind in ("random", "converted_random"):
        model = (random_model if kind == "random" else converted_random_model)(
            likelihood, outputs, n=n
        )
    else:
        model = image_model(
            likelihood, outputs, normalization=options(name).get("normalization", True), n=n
        )
    metrics = [m() if callable(m) else m for m in metrics]
    model.compile(
        optimizer=optimizer(),
        metrics=metrics,
        dataset_size=BATCH * STEPS * 4,
        parallel=options(name).get("parallel", "data"),
    )
    return model


def custom_loop(model, strategy, x, y):
    """The documented loop (bayesian_gradients + apply) under strategy.run, over distributed batches."""
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)

    @tf.function
    def train(xb, yb):
        def step(xb, yb):
            grads, info = model.bayesian_gradients(xb, yb)
            model.optimizer.apply(grads, model.trainable_variables, info)

        strategy.run(step, args=(xb, yb))

    for xb, yb in strategy.experimental_distribute_dataset(dataset):
        train(xb, yb)


def train(name, strategy, loop):
    kind, likelihood = RUNS[name][:2]
    x, y = data(kind, likelihood)
    keras.mixed_precision.set_global_policy(options(name).get("policy", "float32"))
    with strategy.scope():
        model = build(name)
        if loop == "custom":
            model.optimizer.build(model.trainable_variables)
    if loop == "fit":
        history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    else:
        custom_loop(model, strategy, x, y)
        history = {}
    evaluation = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    predictions = model.predict(x, batch_size=BATCH, verbose=0)
    if likelihood in (
        "categorical",
        "bernoulli",
    ):  # the per-particle outputs and the uncertainty decomposition
        predictions = {
            "mean": predictions,
            "particles": model.predict_particles(x, batch_size=BATCH),
            "mutual_information": model.uncertainty(x, batch_size=BATCH)["mutual_information"],
        }
    # In order (layer names differ between two builds in one process: lstm, lstm_1, ...).
    state = {
        i: (v.path, np.array(v.numpy()))
        for i, v in enumerate(model.variables + model.optimizer.variables)
    }
    # Under the strategy every variable must be mirrored, and its copies identical.
    in_sync = all(
        all(np.array_equal(c.numpy(), v.value.values[0].numpy()) for c in v.value.values)
        if hasattr(v.value, "values")
        else strategy.num_replicas_in_sync == 1
        for v in model.variables + model.optimizer.variables
    )
    keras.mixed_precision.set_global_policy("float32")
    assert model.parallel == (
        options(name).get("parallel", "data") if strategy.num_replicas_in_sync > 1 else "data"
    )
    return state, history, evaluation, predictions, in_sync


def largest_difference(a, b):
    """max |a - b| / (1 + max |a|) over arrays."""
    if isinstance(a, dict):  # a Normal likelihood predicts {"mean", "stddev"}
        return max(largest_difference(a[k], b[k]) for k in a)
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / (1.0 + np.max(np.abs(a)))) if a.size else 0.0


def main(names, loops=("fit", "custom")):
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    for name in names:
        for loop in loops:
            if loop == "custom" and name == "keras_adam":
                continue
            one, history1, eval1, pred1, _ = train(name, tf.distribute.get_strategy(), loop)
            two, history2, eval2, pred2, in_sync = train(name, mirrored, loop)
            result = {
                "name": name,
                "loop": loop,
                "in_sync": in_sync,
                "policy": options(name).get("policy", "float32"),
                "state": max(largest_difference(one[k][1], two[k][1]) for k in one),
                "worst_variable": one[
                    max(one, key=lambda k: largest_difference(one[k][1], two[k][1]))
                ][0],
                "history": max(
                    [largest_difference(history1[k], history2[k]) for k in history1] + [0.0]
                ),
                "history_keys": sorted(history2) == sorted(history1),
                "evaluate": max(largest_difference(eval1[k], eval2[k]) for k in eval1),
                "predict": largest_difference(pred1, pred2),
                "moved": moved(name, one),
            }
            print(json.dumps(result), flush=True)


def moved(name, state):
    """How far training moved the kernels from their initial values (the comparison is not vacuous)."""
    keras.mixed_precision.set_global_policy(options(name).get("policy", "float32"))
    model = build(name)
    keras.mixed_precision.set_global_policy("float32")
    return max(
        largest_difference(v.numpy(), state[i][1])
        for i, v in enumerate(model.variables)
        if "kernel" in v.path
    )


def refinement():
    """bk.refine after MGVBP training, on one device and under 2 replicas: largest difference of the
    refined particles' outputs and of the predictive (one JSON line)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")

    def run(strategy):
        with strategy.scope():
            keras.utils.set_random_seed(3)
            model = bk.zoo.mlp(6, 2, hidden=(8,), num_particles=4)
            model.compile(
                optimizer=bk.optimizers.MGVBP(1e-2, structure="diagonal", seed=1),
                likelihood="categorical",
            )
        model.fit(x, y, batch_size=16, epochs=2, verbose=0)
        before = model.predict_particles(x)
        bk.refine(model, x, y, num_stages=2, steps_per_stage=3, batch_size=16, seed=0, verbose=0)
        return before, model.predict_particles(x), model.predictive(x).probs_parameter().numpy()

    one, two = (
        run(tf.distribute.get_strategy()),
        run(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])),
    )
    print(
        json.dumps(
            {
                "refined": largest_difference(one[1], two[1]),
                "predictive": largest_difference(one[2], two[2]),
                "moved": largest_difference(one[0], one[1]),
            }
        ),
        flush=True,
    )


def uneven_batches():
    """evaluate with global batches that 2 replicas do not divide (1, 15) against one device (one JSON line)."""
    x, y = data("image", "categorical")
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    results = {}
    for batch in (1, 15):
        scores = []
        for strategy in (tf.distribute.get_strategy(), mirrored):
            with strategy.scope():
                keras.utils.set_random_seed(7)
                model = image_model("categorical", 3)
                model.compile(
                    optimizer=bk.optimizers.GaussianParticleFlow(1e-2),
                    metrics=["accuracy"],
                    dataset_size=len(x),
                )
            history = model.fit(
                x,
                y,
                batch_size=16,
                epochs=1,
                verbose=0,
                shuffle=False,
                validation_data=(x[:31], y[:31]),
                validation_batch_size=batch,
            ).history
            scores.append(
                {
                    **model.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True),
                    **{k: v[-1] for k, v in history.items() if k.startswith("val_")},
                }
            )
        results[batch] = max(largest_difference(scores[0][k], scores[1][k]) for k in scores[0])
    print(json.dumps(results), flush=True)


def refusals():
    """What a user is told for what is not supported (one JSON line: case -> error type and message)."""
    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    cases = {
        "particles_with_curvature": (
            mirrored,
            lambda: bk.optimizers.MatrixSVGD(0.1, preconditioner=kfac()),
            4,
            {},
        ),
        "particles_not_divisible": (mirrored, lambda: bk.optimizers.GaussianParticleFlow(), 3, {}),
        "unknown_parallel": (
            mirrored,
            lambda: bk.optimizers.GaussianParticleFlow(),
            4,
            {"parallel": "model"},
        ),
        "central_storage": (
            tf.distribute.experimental.CentralStorageStrategy(),
            lambda: bk.optimizers.GaussianParticleFlow(),
            4,
            {"parallel": "data"},
        ),
    }
    told = {}
    try:  # built outside the scope, compiled inside: its variables are not mirrored
        model = image_model("categorical", 3)
        with mirrored.scope():
            model.compile(optimizer=bk.optimizers.GaussianParticleFlow())
        told["built_outside_the_scope"] = ["no error", ""]
    except Exception as error:  # noqa: BLE001
        told["built_outside_the_scope"] = [type(error).__name__, str(error)]
    try:  # the documented custom loop without strategy.run
        with mirrored.scope():
            model = image_model("categorical", 3)
            model.compile(optimizer=bk.optimizers.GaussianParticleFlow(), dataset_size=64)
        x, y = data("image", "categorical")
        batch = next(
            iter(
                mirrored.experimental_distribute_dataset(
                    tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
                )
            )
        )
        model.bayesian_gradients(*batch)
        told["custom_loop_without_run"] = ["no error", ""]
    except Exception as error:  # noqa: BLE001
        told["custom_loop_without_run"] = [type(error).__name__, str(error)]
    x, y = data("image", "categorical")

    def with_keras_layer(layer, on_inputs):
        """A small conv net with a Keras layer that draws for its own rows only, on its inputs (before
        the particle axis) or after the first particle layer."""
        with mirrored.scope():
            inputs = keras.Input((6, 6, 1))
            h = layer(inputs) if on_inputs else inputs
            h = bk.layers.Conv2D(3, 3, num_particles=2)(h)
            h = bk.layers.Flatten()(h if on_inputs else layer(h))
            model = bk.BayesianModel(inputs, bk.layers.Dense(3)(h), likelihood="categorical")
            model.compile(optimizer=bk.optimizers.GaussianParticleFlow(), dataset_size=64)
        return model

    for case, layer in (
        ("keras_dropout", lambda: keras.layers.Dropout(0.3)),
        ("keras_augmentation", lambda: keras.layers.RandomFlip()),
    ):
        try:  # a Keras layer that draws for its own rows only
            model = with_keras_layer(layer(), on_inputs=True)
            model.fit(x, y, batch_size=16, epochs=1, verbose=0)
            told[case] = ["no error", ""]
        except Exception as error:  # noqa: BLE001
            told[case] = [type(error).__name__, str(error)]
    try:  # a Keras Dropout in the documented custom loop (strategy.run of bayesian_gradients)
        model = with_keras_layer(keras.layers.Dropout(0.3), on_inputs=False)
        batch = next(
            iter(
                mirrored.experimental_distribute_dataset(
                    tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
                )
            )
        )
        mirrored.run(tf.function(model.bayesian_gradients), args=batch)
        told["keras_dropout_custom_loop"] = ["no error", ""]
    except Exception as error:  # noqa: BLE001
        told["keras_dropout_custom_loop"] = [type(error).__name__, str(error)]
    for case, (strategy, optimizer, n, kwargs) in cases.items():
        kwargs = {"parallel": "particles", **kwargs}
        try:
            with strategy.scope():
                model = image_model("categorical", 3, n=n)
                model.compile(optimizer=optimizer(), **kwargs)
            told[case] = ["no error", ""]
        except Exception as error:  # noqa: BLE001 (the test reads the type and the message)
            told[case] = [type(error).__name__, str(error)]
    print(json.dumps(told), flush=True)


if __name__ == "__main__":
    # two logical CPU devices, before TensorFlow initialises (importing the script, as the test does to read
    # RUNS, leaves the process' devices alone)
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
    )
    if sys.argv[1:] == ["--refusals"]:
        refusals()
    elif sys.argv[1:] == ["--refine"]:
        refinement()
    elif sys.argv[1:] == ["--uneven"]:
        uneven_batches()
    else:
        loops = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--loop=")]
        names = [a for a in sys.argv[1:] if not a.startswith("--")]
        main(names or list(RUNS), tuple(loops) or ("fit", "custom"))
