"""ResNet-20 with a particle axis: N ResNet-20s in one pass, equal to N separate Keras ResNet-20s."""

import keras
import numpy as np
import pytest

import bayes_keras as bk


def _copy_particle_into(model, particle, keras_model):
    """Set the Keras twin's weights (trainable and BN statistics) to one particle's (or the shared) values."""
    for layer in keras_model.layers:
        if not layer.weights:
            continue
        source = model.get_layer(layer.name)
        values = []
        for variable in source.weights:
            value = variable.numpy()
            per_particle = (
                getattr(variable, "is_particle_variable", False) or "moving" in variable.path
            )
            values.append(value[particle] if per_particle else value)
        layer.set_weights(values)


def test_equals_separate_keras_resnets_and_counts_their_weights():
    keras.utils.set_random_seed(0)
    model = bk.zoo.resnet20((8, 8, 1), 10, num_particles=2, deterministic_parts=("stem",))
    twin = bk.zoo.keras_resnet20((8, 8, 1), 10)
    assert sum(int(np.prod(v.shape[1:])) for v in model.particle_variables) + sum(
        int(np.prod(v.shape))
        for v in model.trainable_variables
        if not getattr(v, "is_particle_variable", False)
    ) == twin.count_params() - sum(int(np.prod(v.shape)) for v in twin.non_trainable_weights)
    (x, y), _ = bk.datasets.load_digits()
    model.compile(optimizer=bk.optimizers.IndependentParticles(1e-3))
    model.fit(
        x[:128], y[:128], epochs=1, batch_size=64, verbose=0
    )  # moves BN statistics apart per particle
    outputs = model.predict_particles(x[:16])
    for particle in range(2):
        _copy_particle_into(model, particle, twin)
        np.testing.assert_allclose(
            outputs[:, particle], twin.predict(x[:16], verbose=0), rtol=1e-4, atol=1e-4
        )


@pytest.mark.parametrize(
    "optimizer",
    [
        bk.optimizers.GaussianParticleFlow,
        bk.optimizers.IndependentParticles,
        # ~15 s each (tracing a ResNet-20): on demand with -m slow
        pytest.param(bk.optimizers.SVGD, marks=pytest.mark.slow),
        pytest.param(bk.optimizers.MeanFieldVI, marks=pytest.mark.slow),
    ],
)
def test_trains_through_fit(optimizer):
    (x, y), _ = bk.datasets.load_digits()
    keras.utils.set_random_seed(0)
    model = bk.zoo.resnet20((8, 8, 1), 10, num_particles=2, deterministic_parts=("stage1",))
    model.compile(optimizer=optimizer())
    losses = model.fit(x[:192], y[:192], epochs=3, batch_size=64, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses


@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: bk.optimizers.MatrixSVGD(),  # KFAC with BatchNormalization's diagonal blocks
        lambda: bk.optimizers.MGVBP(curvature="empirical_fisher"),
        pytest.param(lambda: bk.optimizers.PreconditionedParticles(), marks=pytest.mark.slow),
        pytest.param(lambda: bk.optimizers.MGVBP(), marks=pytest.mark.slow),
    ],
    ids=["MatrixSVGD", "MGVBP-empirical_fisher", "PreconditionedParticles", "MGVBP"],
)
def test_curvature_optimizers_train_it(optimizer):
    (x, y), _ = bk.datasets.load_digits()
    keras.utils.set_random_seed(0)
    model = bk.zoo.resnet20((8, 8, 1), 10, num_particles=2, deterministic_parts=("stage1",))
    model.compile(optimizer=optimizer())
    losses = model.fit(x[:192], y[:192], epochs=3, batch_size=64, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    with pytest.raises(ValueError, match="Unknown ResNet-20 parts"):
        bk.zoo.resnet20(deterministic_parts=("stage4",))


def test_initialize_particles_from_a_trained_keras_resnet():
    """The GPF paper's protocol (particles around MAP weights): every weight of the Keras twin, BN moving
    statistics included, becomes the particles' centre; with no jitter each particle IS the Keras net."""
    (x, y), _ = bk.datasets.load_digits()
    keras.utils.set_random_seed(1)
    twin = bk.zoo.keras_resnet20((8, 8, 1), 10)
    twin.compile(
        keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    twin.fit(x[:128], y[:128], epochs=1, batch_size=64, verbose=0)  # BN statistics away from 0 / 1
    model = bk.zoo.resnet20((8, 8, 1), 10, num_particles=3, deterministic_parts=("stem",))
    model.initialize_particles(twin, noise_std=0.0)
    expected = twin.predict(x[:16], verbose=0)
    outputs = model.predict_particles(x[:16])
    for particle in range(3):
        np.testing.assert_allclose(outputs[:, particle], expected, rtol=1e-4, atol=1e-4)
    model.initialize_particles(twin, noise_std=0.01, seed=0)
    kernel = model.get_layer("head").kernel.numpy()
    rms = np.sqrt(np.mean(np.square(kernel.mean(axis=0))))
    # the jitter lands on weights with priors, 0.01 of the tensor's rms (3 particles: the sd estimate is low)
    assert 0.4 * 0.01 * rms < kernel.std(axis=0).mean() < 1.2 * 0.01 * rms
    moving = model.get_layer("stage1_block0_bn1").moving_mean.numpy()
    np.testing.assert_array_equal(moving[0], moving[1])  # statistics are copied, not jittered
    with pytest.raises(ValueError, match="Pass a Keras model of the same architecture"):
        model.initialize_particles(twin.get_weights()[:5])
