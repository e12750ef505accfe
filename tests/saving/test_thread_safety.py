"""Prediction from several threads at once gives every thread the sequential answer (issue: nothing
silently wrong): predict, predict_particles, uncertainty and predictive keep no per-call state on the model."""

import threading

import keras
import numpy as np

import bayes_keras as bk


def test_eight_threads_mixing_the_prediction_paths_get_the_sequential_results():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 5)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    keras.utils.set_random_seed(0)
    model = bk.zoo.mlp(5, 2, hidden=(8,), num_particles=4)
    model.compile(optimizer=bk.optimizers.GaussianParticleFlow(1e-2), likelihood="categorical")
    model.fit(x, y, epochs=1, batch_size=16, verbose=0)
    calls = {
        "predict": lambda: model.predict(x, batch_size=16, verbose=0),
        "predict_particles": lambda: model.predict_particles(x, batch_size=16),
        "uncertainty": lambda: model.uncertainty(x, batch_size=16)["mutual_information"],
        "predictive": lambda: model.predictive(x, batch_size=16).probs_parameter().numpy(),
    }
    expected = {name: call() for name, call in calls.items()}
    assert expected["predict"].shape == (40, 2) and expected["predict_particles"].shape == (
        40,
        4,
        2,
    )
    failures, errors = [], []

    def work(thread):
        names = sorted(calls)
        for round_ in range(50):
            name = names[(thread + round_) % len(names)]
            try:
                got = calls[name]()
            except Exception as error:  # noqa: BLE001 (collected and reported below)
                errors.append(f"{name}: {error!r}")
                continue
            if got.shape != expected[name].shape or not np.allclose(
                got, expected[name], rtol=1e-5, atol=1e-6
            ):
                failures.append((name, got.shape))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    assert not failures, failures[:5]
