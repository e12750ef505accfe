"""BayesianModel: a keras.Model whose outputs carry a particle axis and whose fit does inference."""

import contextlib
import math
import random
import warnings

import keras
import numpy as np
import tensorflow as tf
from keras.src.models.functional import Functional

from bayes_keras import likelihoods as likelihoods_lib
from bayes_keras._config import check_number
from bayes_keras.curvature import capture
from bayes_keras.layers.base import ParticleLayer
from bayes_keras.layers.mixing_guard import check_layers_keep_particles
from bayes_keras.optimizers.bayesian_optimizer import BayesianOptimizer, StepInfo


@keras.saving.register_keras_serializable(package="bayes_keras")
class BayesianModel(keras.Model):
    """A Keras model over N weight sets (particles), trained by a Bayesian optimizer.

    Outputs are (batch, N, ...). `fit` maximises, for every particle n, the tempered log joint

        log_joint_n = [ (dataset_size / batch) * sum_b log p(y_b | x_b, w_n) + log p(w_n) ] / temperature

    in one forward and one backward pass, and hands the optimizer the gradients of -log_joint_n
    for all particle variables at once. Shared (deterministic) weights get the particle average of
    those gradients (plus their own prior once): they are MAP point estimates.

    Reported metrics: "loss" = -mean_n(log_joint_n) / dataset_size; "nll" = negative log
    likelihood of the POSTERIOR PREDICTIVE (particle-averaged density) per example; compiled
    metrics see the predictive summary (e.g. averaged class probabilities); "free_energy" when the
    optimizer defines a Gaussian (GPF).

    Args:
        likelihood: a `bayes_keras.likelihoods.Likelihood` or its name ("categorical",
            "bernoulli", "normal"); may also be given to compile().
        num_particles: optional check: the number of particles the layers were built with.
        dataset_size: number of training examples (scales the minibatch likelihood); if None it
            is taken from compile()/fit() or inferred from the training data.
        temperature: posterior temperature (1 = Bayes posterior; < 1 "cold").

    Example:
        >>> inputs = keras.Input((30,))
        >>> h = bayes_keras.layers.Dense(32, activation="relu", num_particles=10)(inputs)
        >>> logits = bayes_keras.layers.Dense(2)(h)
        >>> model = bayes_keras.BayesianModel(inputs, logits, likelihood="categorical")
        >>> model.compile(optimizer=bayes_keras.optimizers.GaussianParticleFlow(1e-2), metrics=["accuracy"])
        >>> model.fit(x, y, epochs=10)
        >>> probs = model.predict(x_test)             # (batch, 2) predictive probabilities
        >>> dist = model.predictive(x_test)           # tfd.Categorical
    """

    def __new__(cls, *args, **kwargs):
        # keras.Model(inputs, outputs) on a Model subclass rewrites that class's bases to put Functional in
        # them, for good (keras.src.models.model.inject_functional_model_class): after one functional
        # BayesianModel, every subclassed BayesianModel in the process would be a Functional and fail.
        # The functional form gets its own class instead, which already derives from Functional.
        if _functional_arguments(args, kwargs) and not issubclass(cls, Functional):
            return super().__new__(_functional_class(cls))
        return super().__new__(cls)

    def __init__(self, *args, likelihood=None, num_particles=None, dataset_size=None, temperature=1.0, **kwargs):
        super().__init__(*args, **kwargs)
        if num_particles is not None and (isinstance(num_particles, bool) or not isinstance(num_particles, int)
                                          or num_particles < 1):
            raise ValueError(f"num_particles must be a positive integer; got {num_particles!r}.")
        self._expected_num_particles = num_particles
        self.likelihood = None if likelihood is None else likelihoods_lib.get(likelihood)
        self.dataset_size = None
        if dataset_size is not None:
            self.set_dataset_size(dataset_size)
        self.temperature = check_number(temperature, "temperature")
        self._likelihood_built = False
        self._raw_predict = False
        self._particle_predict_function = None
        self._nll_tracker = keras.metrics.Mean(name="nll")
        # The metrics a BayesianOptimizer may report (its `reported_metrics`), per training example.
        self._method_trackers = {name: keras.metrics.Mean(name=name) for name in ("free_energy", "elbo")}
        self._skipped = keras.Variable(0, dtype="int32", trainable=False, name="skipped_steps")
        # Keys the labels sampled for true-Fisher curvature, with the optimizer's step: saved with the
        # model, so a resumed run draws what an uninterrupted one would (seeded by keras' set_random_seed).
        self._label_seed = keras.Variable(random.randint(0, 2**31 - 1), dtype="int64", trainable=False,
                                          name="label_seed")
        # mixed_float16: dynamic loss scaling done here rather than by wrapping the optimizer in a
        # LossScaleOptimizer, so a Bayesian optimizer sees the model directly (docs/architecture.md).
        self._loss_scale = None
        if self.dtype_policy.name == "mixed_float16":
            self._loss_scale = keras.Variable(2.0 ** 15, dtype="float32", trainable=False, name="loss_scale")
            self._loss_scale_good_steps = keras.Variable(0, dtype="int32", trainable=False,
                                                         name="loss_scale_good_steps")
        if getattr(self, "_is_graph_network", False) or hasattr(self, "outputs") and self.outputs is not None:
            self._check_structure()

    # -- structure -----------------------------------------------------------------------------
    @property
    def skipped_steps(self):
        """Training steps skipped since the model was built because the loss or a gradient was NaN/Inf
        (the particles were left unchanged; fit also warns)."""
        return int(self._skipped.numpy())

    @property
    def particle_layers(self):
        # In the order of the model's weights (Keras' _flatten_layers lists nested layers, e.g. the two
        # directions of a Bidirectional, in reverse), so that per-layer orders agree with get_weights().
        layers = [l for l in self._flatten_layers(include_self=False) if isinstance(l, ParticleLayer)]
        position = {id(v): i for i, v in enumerate(self.weights)}
        return sorted(layers, key=lambda l: min((position.get(id(v), len(position)) for v in l.weights),
                                                default=len(position)))

    @property
    def num_particles(self):
        ns = {l.num_particles for l in self.particle_layers if l.num_particles is not None}
        if len(ns) > 1:
            raise ValueError(f"The model's particle layers disagree on the number of particles: {sorted(ns)}.")
        if ns:
            return ns.pop()
        return self._expected_num_particles

    @property
    def particle_variables(self):
        return [v for l in self.particle_layers for v in l.particle_variables]

    def _check_structure(self):
        outputs = getattr(self, "outputs", None)
        if not outputs:
            return
        if len(outputs) != 1:
            raise ValueError(f"BayesianModel supports one output tensor; got {len(outputs)}.")
        if not self.particle_layers:
            raise ValueError("BayesianModel needs at least one bayes_keras particle layer (e.g. bayes_keras.layers.Dense).")
        check_layers_keep_particles(self.layers, ParticleLayer)
        n = self.num_particles
        if self._expected_num_particles is not None and n != self._expected_num_particles:
            raise ValueError(f"num_particles={self._expected_num_particles} was given, but the layers were built "
                             f"with {n} particles.")
        shape = tuple(outputs[0].shape)
        if len(shape) < 2 or shape[1] != n:
            raise ValueError(f"BayesianModel outputs must be (batch, particles={n}, ...); got {shape}.")
        if self.likelihood is not None:
            self._likelihood_built = False
            self._build_likelihood(shape)  # its variables must exist before the optimizer is built

    def _build_likelihood(self, output_shape):
        if self.likelihood is None:
            raise ValueError("BayesianModel needs a likelihood: pass likelihood='categorical' | 'bernoulli' | "
                             "'normal' (or a bayes_keras.likelihoods object) to the model or to compile().")
        if not self._likelihood_built:
            self.likelihood.build(self, output_shape)
            self._likelihood_built = True

    def set_dataset_size(self, dataset_size):
        if isinstance(dataset_size, bool) or not isinstance(dataset_size, (int, np.integer)) or dataset_size < 1:
            raise ValueError(f"dataset_size must be a positive integer (number of training examples); got {dataset_size!r}.")
        if self.dataset_size != int(dataset_size):
            self.dataset_size = int(dataset_size)
            self.train_function = None  # the size is a constant of the traced step

    # -- compile / fit -------------------------------------------------------------------------
    def compile(self, optimizer="rmsprop", loss=None, metrics=None, likelihood=None, dataset_size=None,
                temperature=None, **kwargs):
        """As keras.Model.compile, with `likelihood=` instead of a loss (a matching Keras loss name,
        e.g. "sparse_categorical_crossentropy", is accepted and mapped to its likelihood)."""
        if loss is not None:
            if likelihood is not None:
                raise ValueError("Pass either likelihood= or loss= to BayesianModel.compile, not both.")
            try:
                likelihood = likelihoods_lib.get(loss)
            except ValueError:
                raise ValueError(
                    f"BayesianModel trains on a likelihood, not a loss; got loss={loss!r}. Use likelihood="
                    "'categorical' | 'bernoulli' | 'normal' or a bayes_keras.likelihoods object.") from None
        if likelihood is not None:
            self.likelihood = likelihoods_lib.get(likelihood)
            self._likelihood_built = False
            self._check_structure()
        if dataset_size is not None:
            self.set_dataset_size(dataset_size)
        if temperature is not None:
            self.temperature = check_number(temperature, "temperature")
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            optimizer = optimizer.inner_optimizer  # the model scales the loss itself (mixed_float16)
        kwargs["auto_scale_loss"] = False
        slow_under_xla = [l.name for l in self.particle_layers if not l.supports_jit]
        if kwargs.get("jit_compile") is True and slow_under_xla:
            warnings.warn(f"jit_compile=True: layers {slow_under_xla} run grouped particle convolutions, which "
                          "XLA compiles 40x slower than TensorFlow's own kernels on CPU; training without XLA "
                          "(on a GPU, XLA is used).", UserWarning, stacklevel=2)
            kwargs["jit_compile"] = False
        super().compile(optimizer=optimizer, metrics=metrics, **kwargs)
        if self._bayesian_optimizer is not None:
            n = self.num_particles
            if n is not None:
                self.optimizer.check_num_particles(n)
            unknown = set(self._bayesian_optimizer.reported_metrics) - set(self._method_trackers)
            if unknown:
                raise ValueError(f"{type(self.optimizer).__name__} reports metrics {sorted(unknown)}; BayesianModel "
                                 f"tracks {sorted(self._method_trackers)}.")

    @property
    def _bayesian_optimizer(self):
        """The optimizer when it is a BayesianOptimizer; None for a plain Keras optimizer (which then
        steps every particle along its own gradient: a MAP ensemble) or before compile."""
        optimizer = getattr(self, "optimizer", None)
        return optimizer if isinstance(optimizer, BayesianOptimizer) else None

    def compile_from_config(self, config):
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def fit(self, x=None, y=None, batch_size=None, epochs=1, *args, dataset_size=None, callbacks=None, **kwargs):
        """As keras.Model.fit. `dataset_size` (number of training examples) is taken from here, from
        compile(), or inferred: len(x) for arrays, a counting pass for a finite tf.data.Dataset."""
        if dataset_size is not None:
            self.set_dataset_size(dataset_size)
        elif self.dataset_size is None:
            self.set_dataset_size(_infer_dataset_size(x, kwargs.get("validation_split", 0.0)))
        if self.optimizer is not None and not self.optimizer.built and self.built and self.trainable_variables:
            # Build before tracing, so optimizers that initialise from the weights see their values
            # (a subclassed model not yet called is built, with its optimizer, by Keras' fit).
            self.optimizer.build(self.trainable_variables)
        callbacks = list(callbacks or []) + [_NonFiniteStepWarning(self)]
        return super().fit(x, y, batch_size, epochs, *args, callbacks=callbacks, **kwargs)

    # -- the step ------------------------------------------------------------------------------
    def log_prior(self):
        """(N,) log prior of the particle weights and the scalar log prior of shared weights."""
        particle = [l.log_prior() for l in self.particle_layers if not l.deterministic]
        shared = [l.log_prior() for l in self.particle_layers if l.deterministic]
        return tf.add_n(particle), (tf.add_n(shared) if shared else tf.zeros((), self.loss_dtype))

    @property
    def loss_dtype(self):
        """The dtype of log densities, losses and gradients: the variables' dtype (float32 under the
        mixed policies, whose low-precision outputs are cast to it as Keras casts its losses)."""
        return tf.as_dtype(self.dtype_policy.variable_dtype)

    def _log_joint(self, y, outputs, sample_weight, parts=False):
        loglik = self.likelihood.log_prob(y, outputs)  # (batch, N)
        if sample_weight is not None:
            loglik = loglik * tf.cast(tf.reshape(sample_weight, (-1, 1)), loglik.dtype)
        batch = tf.cast(tf.shape(loglik)[0], loglik.dtype)
        scale = float(self.dataset_size) / batch
        particle_prior, shared_prior = self.log_prior()
        scaled_loglik = scale * tf.reduce_sum(loglik, axis=0) / self.temperature
        particle_prior = particle_prior / self.temperature
        log_joint = scaled_loglik + particle_prior
        if parts:
            return log_joint, shared_prior / self.temperature, scaled_loglik, particle_prior
        return log_joint, shared_prior / self.temperature

    def bayesian_gradients(self, x, y, sample_weight=None):
        """One forward and backward pass: (grads, step) for `optimizer.apply(grads,
        model.trainable_variables, step)`, the pieces of train_step for custom training loops.

        grads are the gradients of the negative tempered log joint (per particle for particle variables,
        the particle mean for shared ones), aligned with `model.trainable_variables` (None where a
        variable does not reach the loss); step is the `bayes_keras.optimizers.StepInfo` the optimizer
        needs (log likelihood and prior per particle, curvature records it asked for, its noise).

        Example (equals fit, step for step):
            >>> @tf.function
            ... def train(x, y):
            ...     grads, step = model.bayesian_gradients(x, y)
            ...     model.optimizer.apply(grads, model.trainable_variables, step)
        """
        return self._gradients(x, y, sample_weight)[:2]

    def _gradients(self, x, y, sample_weight):
        """(grads, step, outputs, finite_loss): see bayesian_gradients."""
        if self.dataset_size is None:
            raise ValueError("Unknown training-set size: pass dataset_size= to the model, compile() or fit().")
        optimizer = self._bayesian_optimizer
        # Curvature: only when the optimizer asks; the layers then report their inputs and
        # pre-activations, differentiated in the same backward pass as the weights.
        request = None if optimizer is None else optimizer.curvature_request
        wants_curvature = request is not None
        # True Fisher: a second backward pass (pre-activations only) of labels sampled from the model.
        sampled_labels = wants_curvature and capture.wants_sampled_labels(request)
        # Drawn before the forward pass, off its critical path (see GaussianVariationalOptimizer).
        noise = None if optimizer is None else optimizer.prepare_step()
        with tf.GradientTape(persistent=sampled_labels) as tape:
            with capture.capturing() if wants_curvature else contextlib.nullcontext([]) as records:
                outputs = tf.cast(self(x, training=True), self.loss_dtype)
            self._build_likelihood(outputs.shape)
            trainable = self.trainable_variables  # after the call: a subclassed model builds in its first one
            # A subclassed model's first call also builds it through a symbolic call, whose records are
            # not part of this step.
            records = [r for r in records if _of_this_graph(r.preactivations)]
            log_joint, shared_log_prior, scaled_loglik, particle_prior = self._log_joint(
                y, outputs, sample_weight, parts=True)
            n = tf.cast(tf.shape(log_joint)[0], log_joint.dtype)
            # Particle slices get -grad log_joint_n; shared weights the particle mean (rescaled below).
            loss = -tf.reduce_sum(log_joint) - n * shared_log_prior
            if self.losses:
                loss += n * tf.add_n(self.losses)
            if sampled_labels and records:
                from bayes_keras.curvature.kfac import sampled_negative_log_likelihood  # noqa: I001

                seed = tf.stack([self._label_seed.value, tf.cast(optimizer.iterations, tf.int64)])
                sampled_nll = sampled_negative_log_likelihood(self.likelihood, outputs, seed)  # (batch, N)
                if sample_weight is not None:
                    sampled_nll = sampled_nll * tf.cast(tf.reshape(sample_weight, (-1, 1)), sampled_nll.dtype)
                sampled_nll = tf.reduce_sum(sampled_nll)
            # float16 backward passes differentiate the per-datum loss times a dynamic scale, as Keras
            # scales its (per-example) loss; gradients are unscaled below in the variables' dtype.
            scale = None if self._loss_scale is None else self._loss_scale / float(self.dataset_size)
            scaled_loss = loss if scale is None else loss * scale
            if sampled_labels and records and scale is not None:
                sampled_nll = sampled_nll * scale
        grads = tape.gradient(scaled_loss, trainable + [r.preactivations for r in records])
        grads = [g if g is None or scale is None else tf.cast(g, self.loss_dtype) / scale for g in grads]
        grads, preactivation_grads = grads[:len(trainable)], grads[len(trainable):]
        if records:
            sampled_grads = None
            if sampled_labels:
                sampled_grads = tape.gradient(sampled_nll, [r.preactivations for r in records])
                if scale is not None:
                    sampled_grads = [tf.cast(g, self.loss_dtype) / scale for g in sampled_grads]
            self._finish_records(records, preactivation_grads, tf.shape(outputs)[0], sampled_grads)
        del tape
        if optimizer is not None and not optimizer.built:
            # A subclassed model is built by its first call (here): its optimizer only now sees the variables.
            with tf.init_scope():  # inside the traced step: create and initialise the state eagerly
                optimizer.build(trainable)
        grads = [g if g is None or getattr(v, "is_particle_variable", False) else g / n
                 for g, v in zip(grads, trainable)]
        step = StepInfo(log_likelihood=tf.stop_gradient(scaled_loglik), log_prior=tf.stop_gradient(particle_prior),
                        temperature=self.temperature, dataset_size=float(self.dataset_size),
                        curvature=tuple(records), noise=noise)
        return grads, step, outputs, tf.math.is_finite(loss)

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        grads, step, outputs, finite_loss = self._gradients(x, y, sample_weight)
        optimizer = self._bayesian_optimizer
        finite = finite_loss
        for g in grads:
            if g is not None:
                finite = finite & tf.reduce_all(tf.math.is_finite(g))
        for r in step.curvature:
            finite = finite & tf.reduce_all(tf.math.is_finite(r.output_gradients))
            if r.sampled_output_gradients is not None:
                finite = finite & tf.reduce_all(tf.math.is_finite(r.sampled_output_gradients))
        if optimizer is not None:
            for name, value in optimizer.report(step).items():
                self._method_trackers[name].update_state(value)
        trainable = self.trainable_variables

        def apply():
            if optimizer is None:
                self.optimizer.apply(grads, trainable)
                return tf.constant(True)
            return optimizer.apply(grads, trainable, step)

        def skip():
            if self._loss_scale is None:
                self._skipped.assign_add(1)
                return tf.constant(False)
            # A finite loss with non-finite gradients is a float16 overflow of the scaled backward
            # pass: halve the scale and retry on the next batch (not counted as a NaN step).
            self._loss_scale.assign(tf.where(finite_loss, self._loss_scale / 2.0, self._loss_scale))
            self._loss_scale_good_steps.assign(0)
            self._skipped.assign_add(tf.where(finite_loss, 0, 1))
            return tf.constant(False)

        applied = tf.cond(finite, apply, skip)
        if self._loss_scale is not None:
            self._grow_loss_scale(applied)
        return self._update_metrics(x, y, outputs, step.log_joint, sample_weight)

    def _grow_loss_scale(self, applied):
        """Double the float16 loss scale after 2000 consecutive finite steps (Keras' schedule)."""
        good = tf.where(applied, self._loss_scale_good_steps + 1, 0)
        grow = good >= 2000
        self._loss_scale.assign(tf.where(grow, self._loss_scale * 2.0, self._loss_scale))
        self._loss_scale_good_steps.assign(tf.where(grow, 0, good))

    def _finish_records(self, records, preactivation_grads, batch, sampled_grads=None):
        """Turn d loss / d preactivation into per-example gradients of -log p(y_b | x_b, w_n).

        loss = -sum_n log_joint_n has d loss / d z_bn = -(n_train / (batch T)) d log p(y_b | w_n) / d z_bn.
        `sampled_grads` (true Fisher) are already per-example gradients of -log p(y~_bn | x_b, w_n).
        """
        dtype = self.loss_dtype
        scale = float(self.dataset_size) / (tf.cast(batch, dtype) * self.temperature)
        for i, (r, g) in enumerate(zip(records, preactivation_grads)):
            if g is None:
                raise ValueError(f"Layer '{r.layer.name}' does not influence the loss; curvature cannot be "
                                 "computed for it.")
            # Curvature statistics in the variables' dtype (float16 sums of a a^T would overflow).
            r.inputs = tf.cast(r.inputs, dtype)
            r.extras = None if r.extras is None else {k: tf.cast(v, dtype) for k, v in r.extras.items()}
            r.output_gradients = tf.cast(g, dtype) / scale
            r.dataset_scale = scale
            r.temperature = self.temperature
            if sampled_grads is not None:
                r.sampled_output_gradients = tf.cast(sampled_grads[i], dtype)

    def test_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        outputs = tf.cast(self(x, training=False), self.loss_dtype)
        self._build_likelihood(outputs.shape)
        log_joint = None
        if self.dataset_size is not None:
            log_joint, _ = self._log_joint(y, outputs, sample_weight)
        return self._update_metrics(x, y, outputs, log_joint, sample_weight)

    def _update_metrics(self, x, y, outputs, log_joint, sample_weight):
        if log_joint is not None and self._loss_tracker is not None:
            self._loss_tracker.update_state(-tf.reduce_mean(log_joint) / float(self.dataset_size))
        self._nll_tracker.update_state(-self.likelihood.predictive_log_prob(y, outputs), sample_weight)
        summary = self.likelihood.summary(outputs)
        if isinstance(summary, dict):
            summary = summary["mean"]
        logs = self.compute_metrics(x, y, summary, sample_weight)
        reported = self._reported_metrics()
        for name in self._method_trackers:
            if name not in reported:
                logs.pop(name, None)
        return logs

    def _reported_metrics(self):
        optimizer = self._bayesian_optimizer
        return () if optimizer is None else optimizer.reported_metrics

    @property
    def metrics(self):
        trackers = getattr(self, "_method_trackers", {})
        return super().metrics + [self._nll_tracker] + [trackers[name] for name in self._reported_metrics()]

    def predict_step(self, data):
        x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
        outputs = tf.cast(self(x, training=False), self.loss_dtype)
        if self._raw_predict:
            return outputs
        self._build_likelihood(outputs.shape)
        return self.likelihood.summary(outputs)

    # -- posterior predictive ------------------------------------------------------------------
    def predict_particles(self, x, batch_size=None, verbose=0, **kwargs):
        """Per-particle outputs (batch, N, ...) as a numpy array."""
        saved = self.predict_function
        self.predict_function, self._raw_predict = self._particle_predict_function, True
        try:
            return self.predict(x, batch_size=batch_size, verbose=verbose, **kwargs)
        finally:
            self._particle_predict_function = self.predict_function
            self.predict_function, self._raw_predict = saved, False

    def predictive(self, x, batch_size=None):
        """The posterior predictive p(y | x, D) as a TFP distribution with batch shape (batch,)."""
        outputs = tf.convert_to_tensor(self.predict_particles(x, batch_size=batch_size))
        self._build_likelihood(outputs.shape)
        return self.likelihood.predictive(outputs)

    def uncertainty(self, x, batch_size=None):
        """Uncertainty decomposition per example (numpy arrays).

        Classification: total_entropy = expected_entropy (aleatoric) + mutual_information (epistemic).
        Regression: total_variance = aleatoric_variance + epistemic_variance.
        """
        outputs = tf.convert_to_tensor(self.predict_particles(x, batch_size=batch_size))
        self._build_likelihood(outputs.shape)
        return {k: v.numpy() for k, v in self.likelihood.uncertainty(outputs).items()}

    def initialize_particles(self, center, noise_std=0.1, seed=None):
        """Place every particle at `center` plus N(0, noise_std^2) noise (e.g. around MAP weights).

        `center` is a Keras model of the same architecture with ordinary layers (e.g. a trained
        deterministic network) or a list of arrays in layer order (kernel, bias per layer).
        Shared (deterministic) weights are set to the center exactly.
        """
        arrays = center.get_weights() if hasattr(center, "get_weights") else list(center)
        rng = np.random.default_rng(seed)
        terms = [t for l in self.particle_layers for t in l.prior_terms]
        if len(arrays) != len(terms):
            raise ValueError(f"initialize_particles: expected {len(terms)} arrays (kernel/bias per layer), "
                             f"got {len(arrays)}.")
        for (variable, _, _), a in zip(terms, arrays):
            a = np.asarray(a, dtype=np.float32)
            if getattr(variable, "is_particle_variable", False):
                if tuple(a.shape) != tuple(variable.shape[1:]):
                    raise ValueError(f"initialize_particles: {variable.path} needs per-particle shape "
                                     f"{tuple(variable.shape[1:])}, got {a.shape}.")
                value = a[None] + noise_std * rng.standard_normal(tuple(variable.shape)).astype(np.float32)
            else:
                if tuple(a.shape) != tuple(variable.shape):
                    raise ValueError(f"initialize_particles: {variable.path} needs shape {tuple(variable.shape)}, "
                                     f"got {a.shape}.")
                value = a
            variable.assign(value)

    # -- serialisation -------------------------------------------------------------------------
    def get_config(self):
        config = super().get_config()
        config.update({
            "likelihood": None if self.likelihood is None else likelihoods_lib.serialize(self.likelihood),
            "num_particles": self._expected_num_particles,
            "dataset_size": self.dataset_size,
            "temperature": self.temperature,
        })
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        own = {k: config.pop(k, None) for k in ("likelihood", "num_particles", "dataset_size", "temperature")}
        if own["temperature"] is None:
            own["temperature"] = 1.0
        if own["likelihood"] is not None:
            own["likelihood"] = likelihoods_lib.get(own["likelihood"])
        if "layers" in config and "input_layers" in config:
            from keras.src.models.functional import functional_from_config

            model = functional_from_config(cls, config, custom_objects=custom_objects)
            model.likelihood = own["likelihood"]
            model._expected_num_particles = own["num_particles"]
            model._check_structure()
            model.temperature = check_number(own["temperature"], "temperature")
            if own["dataset_size"] is not None:
                model.set_dataset_size(own["dataset_size"])
            return model
        return cls(**config, **own)


def _of_this_graph(tensor):
    """Whether `tensor` belongs to the running computation (eager, or the current graph or one enclosing it)."""
    if isinstance(tensor, keras.KerasTensor):
        return False
    if not tf.is_symbolic_tensor(tensor):
        return tf.executing_eagerly()
    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        if graph is tensor.graph:
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


def _functional_arguments(args, kwargs):
    """Whether a Model is constructed the functional way (keras' own test of its arguments)."""
    return len(args) == 2 or (len(args) == 1 and "outputs" in kwargs) or ("inputs" in kwargs and "outputs" in kwargs)


_FUNCTIONAL_CLASSES = {}


def _functional_class(cls):
    """`cls` with Functional among its bases (one class per cls), saved under cls's registered name."""
    if cls not in _FUNCTIONAL_CLASSES:
        functional = type(f"Functional{cls.__name__}", (cls, Functional), {"__module__": cls.__module__})
        name = keras.saving.get_registered_name(cls)
        package, _, short = name.rpartition(">")
        if package:  # registered (BayesianModel is): the functional form saves and loads under that name
            functional = keras.saving.register_keras_serializable(package=package, name=short)(functional)
        _FUNCTIONAL_CLASSES[cls] = functional
    return _FUNCTIONAL_CLASSES[cls]


class _NonFiniteStepWarning(keras.callbacks.Callback):
    """Warns when train steps were skipped because the loss or a gradient was not finite."""

    def __init__(self, bayesian_model):
        super().__init__()
        self._bayesian_model = bayesian_model
        self._seen = None

    def _counts(self):
        optimizer = self._bayesian_model._bayesian_optimizer
        updates = 0 if optimizer is None or not optimizer.built else int(optimizer.skipped_updates.numpy())
        return self._bayesian_model.skipped_steps, updates

    def on_train_begin(self, logs=None):
        self._seen = self._counts()

    def on_train_batch_end(self, batch, logs=None):
        counts = self._counts()
        steps, updates = (now - before for now, before in zip(counts, self._seen))
        if steps:
            warnings.warn(
                f"BayesianModel: {steps} training step(s) skipped because the loss or a gradient "
                "was NaN/Inf; the particles were left unchanged. Check the data and lower the learning rate.",
                RuntimeWarning, stacklevel=2)
        if updates:
            optimizer = self._bayesian_model.optimizer
            warnings.warn(
                f"{type(optimizer).__name__}: {updates} update(s) skipped because the new particles or posterior "
                "state were not finite (e.g. a NaN or too large learning rate, an exploding gradient, a "
                "singular curvature); the particles and the optimizer's state were left unchanged. Lower the "
                "learning rate.", RuntimeWarning, stacklevel=2)
        self._seen = counts


def _infer_dataset_size(x, validation_split=0.0):
    if x is None:
        raise ValueError("Unknown training-set size: pass dataset_size= to compile() or fit().")
    if isinstance(x, tf.data.Dataset):
        card = int(x.cardinality())
        if card < 0:
            raise ValueError("Cannot infer the training-set size from an infinite or unknown-length "
                             "tf.data.Dataset: pass dataset_size= to fit() or compile().")

        def count(acc, batch):
            first = tf.nest.flatten(batch)[0]
            return acc + tf.cast(tf.shape(first)[0], tf.int64)

        return int(x.reduce(tf.constant(0, tf.int64), count))
    leaves = tf.nest.flatten(x)
    if leaves and hasattr(leaves[0], "shape") and len(leaves[0].shape) > 0:
        n = int(leaves[0].shape[0])
        # Keras trains on the first floor(n (1 - validation_split)) rows (array_slicing.train_validation_split)
        return max(1, int(math.floor(n * (1.0 - float(validation_split or 0.0)))))
    raise ValueError(f"Cannot infer the training-set size from {type(x).__name__}: pass dataset_size= to fit() "
                     "or compile().")
