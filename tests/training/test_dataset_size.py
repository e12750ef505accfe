"""The training-set size (which scales the likelihood against the prior) from anything Keras' fit accepts
whose size is knowable, exactly; an upper bound with a warning, or a clear error, otherwise. And the
warning for one particle where the uncertainty needs several."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk

RNG = np.random.default_rng(0)
X = RNG.standard_normal((100, 4)).astype("float32")
Y = (X[:, :1] + 0.1 * RNG.standard_normal((100, 1))).astype("float32")


class Batches(keras.utils.PyDataset):
    """100 examples in batches of 32: the last batch has 4."""

    def __init__(self, length=True):
        super().__init__()
        self.length = length

    @property
    def num_batches(self):
        return 4 if self.length else None

    def __getitem__(self, i):
        i = i % 4
        return X[i * 32 : (i + 1) * 32], Y[i * 32 : (i + 1) * 32]


def _model(num_particles=2, likelihood="normal"):
    inputs = keras.Input((4,))
    model = bk.BayesianModel(
        inputs, bk.layers.Dense(1, num_particles=num_particles)(inputs), likelihood=likelihood
    )
    model.compile(optimizer=bk.optimizers.SVGD())
    return model


def _generator():
    while True:
        for i in range(4):
            yield X[i * 32 : (i + 1) * 32], Y[i * 32 : (i + 1) * 32]


def test_exact_sizes():
    model = _model()
    model.fit(Batches(), epochs=0, verbose=0)
    assert model.dataset_size == 100  # 3 x 32 + 4
    # the targets are standardised from the PyDataset's own targets, as from the arrays
    reference = _model()
    reference.fit(X, Y, epochs=0, verbose=0)
    np.testing.assert_allclose(
        model.likelihood.noise_scale().numpy(),
        reference.likelihood.noise_scale().numpy(),
        rtol=1e-6,
    )
    assert not np.allclose(
        reference.likelihood.noise_scale().numpy(), _model().likelihood.noise_scale().numpy()
    )
    model = _model()
    model.fit(
        tf.data.Dataset.from_tensor_slices((X, Y)).batch(32).repeat().take(3), epochs=1, verbose=0
    )
    assert model.dataset_size == 96  # cardinality known after take(): three batches of 32
    model = _model()
    model.fit(X, Y, validation_split=0.2, epochs=1, verbose=0)
    assert model.dataset_size == 80


def test_unknown_lengths_give_an_upper_bound_with_a_warning_or_an_error():
    repeated = tf.data.Dataset.from_tensor_slices((X, Y)).batch(32).repeat()
    model = _model()
    with pytest.warns(UserWarning, match="upper bound"):
        model.fit(repeated, steps_per_epoch=4, epochs=1, verbose=0)
    assert model.dataset_size == 128
    model = _model()
    with pytest.warns(UserWarning, match="upper bound"):
        model.fit(Batches(length=False), steps_per_epoch=4, epochs=1, verbose=0)
    assert model.dataset_size == 128
    with pytest.raises(ValueError, match="Python generator.*dataset_size="):
        _model().fit(_generator(), steps_per_epoch=4, epochs=1, verbose=0)
    with pytest.raises(
        ValueError, match="infinite tf.data.Dataset.*steps_per_epoch="
    ):  # it would never end
        _model().fit(repeated, epochs=1, verbose=0, dataset_size=128)
    model = _model(
        likelihood=bk.likelihoods.Normal(standardize=False)
    )  # nothing to read from the generator
    model.fit(
        _generator(), steps_per_epoch=4, epochs=1, verbose=0, dataset_size=100
    )  # given: no guess
    assert model.dataset_size == 100


@pytest.mark.parametrize(
    "make,warns",
    [
        (bk.optimizers.SVGD, True),
        (bk.optimizers.MatrixSVGD, True),
        (bk.optimizers.IndependentParticles, True),
        (bk.optimizers.PreconditionedParticles, True),
        (bk.optimizers.MeanFieldVI, False),
    ],
)
def test_one_particle_warns_where_the_uncertainty_needs_several(make, warns):
    inputs = keras.Input((4,))
    model = bk.BayesianModel(
        inputs, bk.layers.Dense(1, num_particles=1)(inputs), likelihood="normal"
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.compile(optimizer=make())
        model.fit(X, Y, epochs=1, verbose=0)
    messages = [str(w.message) for w in caught if "num_particles=1" in str(w.message)]
    assert len(messages) == int(warns), messages
