"""MeanFieldVI (the mean-field baseline): its optimum on a conjugate model is the mean-field optimum."""

import numpy as np
import pytest
import tensorflow as tf

import bayes_keras as bk
from targets import (
    assert_within_sampling_error,
    correlated_linear_data,
    exact_linear_posterior,
    linear_model,
)


def test_mean_field_vi_finds_the_mean_field_optimum():
    """Same target as MGVBP's diagonal test: exact mean, precisions = diag of the posterior precision."""
    noise = 0.5
    x, y = correlated_linear_data(noise)
    mean, cov = exact_linear_posterior(x, y, noise)
    target = np.diag(np.linalg.inv(cov))
    model = linear_model(3, 100, bk.likelihoods.Normal(scale=noise))
    optimizer = bk.optimizers.MeanFieldVI(
        bk.schedules.ConstantThenInverseTime(0.01, 2000), initial_std=0.1, seed=2
    )
    model.compile(optimizer=optimizer)
    history = model.fit(
        tf.data.Dataset.from_tensors((x, y)).repeat(6000), dataset_size=len(x), verbose=0
    )
    q = optimizer.posterior()  # one flat block: a diagonal Normal over the flattened weights
    mu, sd = q.mean().numpy(), q.stddev().numpy()
    assert np.all(np.abs(mu - mean) < 0.1 / np.sqrt(target))
    np.testing.assert_allclose(1.0 / sd**2, target, rtol=0.1)
    assert np.isfinite(history.history["elbo"][-1])
    # the particles are samples of q
    kernel = model.particle_variables[0].numpy()[:, :, 0]
    assert_within_sampling_error(
        kernel.mean(0), mu[:3], sd[:3] / np.sqrt(100), what="particle mean"
    )


def test_mean_field_vi_rejects_bad_std():
    with pytest.raises(ValueError, match="initial_std"):
        bk.optimizers.MeanFieldVI(initial_std=0.0)
