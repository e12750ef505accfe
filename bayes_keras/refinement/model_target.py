"""A BayesianModel as the target of local refinement: its log likelihood, gradients and base posterior."""

import numpy as np
import tensorflow as tf

from bayes_keras.core.particle_view import ParticleView
from bayes_keras.model import BayesianModel
from bayes_keras.optimizers.gaussian_vi.gaussian_variational_optimizer import (
    GaussianVariationalOptimizer,
)
from bayes_keras.priors import Normal


class ModelTarget:
    """ell(w) = (dataset-scaled log likelihood) / T of a model's particles, and its gradient, from the model's
    own step (`bayesian_gradients`); the layers' Normal priors, tempered to N(loc, T s^2), are the prior."""

    def __init__(self, model, x, y, batch_size, sample_weight, seed):
        if not isinstance(model, BayesianModel):
            raise ValueError(
                f"refine needs a bayes_keras.BayesianModel; got {type(model).__name__}."
            )
        optimizer = getattr(model, "optimizer", None)
        if not isinstance(optimizer, GaussianVariationalOptimizer) or not optimizer.built:
            raise ValueError(
                "refine starts from a trained Gaussian posterior: compile the model with "
                "MGVBP(structure='diagonal') or MeanFieldVI and fit it first; got optimizer "
                f"{type(optimizer).__name__}{'' if optimizer is None or optimizer.built else ' (not trained)'}."
            )
        self.model, self.optimizer = model, optimizer
        self.view = ParticleView(model.particle_variables)
        self.num_particles = self.view.num_particles
        self.dim = int(sum(self.view.sizes))
        self.dtype = self.view.variables[0].dtype
        self.temperature = float(model.temperature)
        self.dataset_size = float(model.dataset_size)
        self.base_steps = int(optimizer.iterations.numpy())
        self._positions = [
            next(i for i, v in enumerate(model.trainable_variables) if v is p)
            for p in self.view.variables
        ]
        self._train, self._evaluate = _datasets(x, y, sample_weight, batch_size, seed)
        self._iterator = iter(self._train)

    # -- what refine reads ---------------------------------------------------------------------
    def base_posterior(self):
        """(mean, variance), (D,) float64, of the optimizer's diagonal Gaussian in particle-variable order."""
        marginals = self.optimizer.posterior(flatten=False)
        means, variances = [], []
        for variable in self.view.variables:
            q = marginals[variable.path]
            if not _is_diagonal(q):
                raise ValueError(
                    f"refine needs a diagonal Gaussian posterior (MGVBP(structure='diagonal') or "
                    f"MeanFieldVI); {type(self.optimizer).__name__} holds {type(q).__name__} marginals."
                )
            means.append(np.asarray(q.mean(), np.float64).ravel())
            variances.append(np.square(np.asarray(q.stddev(), np.float64)).ravel())
        return np.concatenate(means), np.concatenate(variances)

    def prior(self):
        """(loc, variance), (D,): the tempered Normal priors of the particle weights."""
        locs, variances = [], []
        for i, (variable, size) in enumerate(zip(self.view.variables, self.view.sizes)):
            prior, fan_in = self.view.priors[i] or (None, None)
            if not isinstance(prior, Normal):
                raise ValueError(
                    f"refine splits a Normal prior into auxiliary variables; {variable.path} has "
                    f"{prior!r}."
                )
            locs.append(np.full(size, prior.loc))
            variances.append(np.full(size, self.temperature * prior.stddev(fan_in) ** 2))
        self._loc = tf.constant(np.concatenate(locs), self.dtype)
        self._inverse_variance = tf.constant(1.0 / np.concatenate(variances), self.dtype)
        return np.concatenate(locs), np.concatenate(variances)

    def next_batch(self):
        return next(self._iterator)

    def value_and_gradient(self, w, batch):
        """(ell (M,), grad ell (M, D)) at particles w on one minibatch (unbiased for the whole data set)."""
        self.assign_samples(w)
        x, y, sample_weight = _unpack(batch)
        grads, step = self.model.bayesian_gradients(x, y, sample_weight, optimizer=None)
        flat = self.view.flatten([grads[i] for i in self._positions], self.dtype)
        # grads are of -(log lik + log prior) / T: add back the prior's part, -(w - loc) / (T s^2)
        grad_log_joint = -tf.concat(flat, axis=-1)
        return step.log_likelihood, grad_log_joint + (w - self._loc) * self._inverse_variance

    def expected_log_likelihood(self, stages):
        """E_q[ell] for every q_m, one pass over the data with a fresh draw per batch, float64 (M,)."""
        total = np.zeros(self.num_particles)
        for batch in self._evaluate:
            x, y, sample_weight = _unpack(batch)
            total += self._batch_log_likelihood(stages.sample(), x, y, sample_weight).numpy()
        return total / self.temperature

    @tf.function
    def _batch_log_likelihood(self, w, x, y, sample_weight):
        self.assign_samples(w)
        outputs = tf.cast(self.model(x, training=False), self.model.loss_dtype)
        log_lik = self.model.likelihood.log_prob(y, outputs)  # (batch, M)
        if sample_weight is not None:
            log_lik = log_lik * tf.cast(tf.reshape(sample_weight, (-1, 1)), log_lik.dtype)
        return tf.cast(tf.reduce_sum(log_lik, axis=0), tf.float64)

    # -- the particles ---------------------------------------------------------------------------
    def assign_samples(self, w):
        """Write (M, D) weight sets into the particle variables."""
        pieces = self.view.split(tf.convert_to_tensor(w), list(range(len(self.view))))
        for i, variable in enumerate(self.view.variables):
            variable.assign(tf.cast(pieces[i], variable.dtype))

    def particle_values(self):
        return [v.numpy() for v in self.view.variables]

    def assign_particles(self, values):
        for variable, value in zip(self.view.variables, values):
            variable.assign(value)


def _is_diagonal(q):
    import tensorflow_probability as tfp

    tfd = tfp.distributions
    return isinstance(q, tfd.Normal) or (
        isinstance(q, tfd.Independent) and isinstance(q.distribution, tfd.Normal)
    )


def _unpack(batch):
    if isinstance(batch, (tuple, list)):
        x = batch[0]
        y = batch[1] if len(batch) > 1 else None
        sample_weight = batch[2] if len(batch) > 2 else None
        return x, y, sample_weight
    raise ValueError(
        "refine: a tf.data.Dataset must yield (x, y) or (x, y, sample_weight) batches."
    )


def _datasets(x, y, sample_weight, batch_size, seed):
    """(an endless shuffled training stream, one pass for the bounds), as fit would read the data."""
    if x is None:
        raise ValueError(
            "refine needs the training data: refine(model, x, y) or a tf.data.Dataset of (x, y)."
        )
    if isinstance(x, tf.data.Dataset):
        if y is not None:
            raise ValueError(
                "refine: with a tf.data.Dataset pass y=None (the dataset yields (x, y) batches)."
            )
        return x.repeat(), x
    if y is None:
        raise ValueError("refine: arrays need targets y.")
    if isinstance(batch_size, bool) or int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}.")
    tensors = (x, y) if sample_weight is None else (x, y, sample_weight)
    data = tf.data.Dataset.from_tensor_slices(tensors)
    n = int(np.shape(x)[0])
    train = (
        data.shuffle(n, seed=seed, reshuffle_each_iteration=True).batch(int(batch_size)).repeat()
    )
    return train, data.batch(int(batch_size))
