"""BayesianModel: a keras.Model whose outputs carry a particle axis and whose fit does inference."""

import collections.abc
import inspect
import math
import random
import warnings

import keras
import numpy as np
import tensorflow as tf

# keras.src: no public name for a graph (functional) model; Sequential is not one
from keras.src.models.functional import Functional

from bayes_keras.training import call_checks
from bayes_keras.training import distribute
from bayes_keras import likelihoods as likelihoods_lib
from bayes_keras._config import check_number
from bayes_keras.core.bayesian_optimizer import BayesianOptimizer
from bayes_keras.training.batch_norm_refresh import (
    DEFAULT_MAX_EXAMPLES,
    batch_norm_layers,
    refresh_batch_norm,
)
from bayes_keras.layers.base import ParticleLayer
from bayes_keras.layers.mixing_guard import check_layers_keep_particles
from bayes_keras.likelihoods.likelihood import check_output_activation
from bayes_keras.training.model_metrics import ModelMetrics, split_metrics
from bayes_keras.saving.model_serialization import ModelSerialization
from bayes_keras.training.particle_initialization import initialize_particles
from bayes_keras.training.particle_parallel import ParticleSlices
from bayes_keras.training.particle_predictor import ParticlePredictor
from bayes_keras.training.particle_trainer import ParticleTrainer


@keras.saving.register_keras_serializable(package="bayes_keras")
class BayesianModel(ModelSerialization, ParticleTrainer, ParticlePredictor, keras.Model):
    """A Keras model over N weight sets (particles), trained by a Bayesian optimizer.

    Outputs are (batch, N, ...). `fit` maximises, for every particle n, the tempered log joint

        log_joint_n = [ (dataset_size / batch) * sum_b log p(y_b | x_b, w_n) + log p(w_n) ] / temperature

    in one forward and one backward pass, and hands the optimizer the gradients of -log_joint_n
    for all particle variables at once. Shared weights get the particle average of those gradients: the
    weights of deterministic particle layers plus their prior once (MAP point estimates); weights outside
    particle layers (Keras layers before the particle axis, layers kept without a particle version) have no
    prior, only any Keras regularizer on their layer (counted once): maximum-likelihood or penalised
    estimates.

    Reported metrics (docs/architecture.md, "Metrics"): "loss" = -mean_n(log_joint_n) / dataset_size, the
    training objective per example (in evaluate, on the evaluated data with the training set's size); "nll"
    = negative log likelihood of the POSTERIOR PREDICTIVE (particle-averaged density) per example;
    compiled Keras metrics see the predictive summary (what `predict` returns: class probabilities, or
    the predictive mean for a Normal likelihood; "accuracy" is resolved by the likelihood);
    `bayes_keras.metrics.ParticleMetric`s (e.g. IntervalCoverage) see the per-particle outputs; in training
    only, "free_energy" (GPF) or "elbo" (Gaussian VI) from the optimizer.

    Constructed as a functional model (inputs, outputs), as a subclass with a `call`, or from a built Keras
    model of particle layers, e.g. `BayesianModel(keras.Sequential([keras.Input(...), ...]))` (its inputs
    and outputs, sharing its layers).

    Args:
        likelihood: a `bayes_keras.likelihoods.Likelihood` or its name ("categorical",
            "bernoulli", "normal"); may also be given to compile().
        num_particles: optional check: the number of particles the layers were built with.
        dataset_size: number of training examples (scales the minibatch likelihood); if None it
            is taken from compile()/fit() or inferred from the training data on every fit.
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

    def __init__(
        self,
        *args,
        likelihood=None,
        num_particles=None,
        dataset_size=None,
        temperature=1.0,
        **kwargs,
    ):
        # BayesianModel(keras.Sequential([...]))
        if len(args) == 1 and isinstance(args[0], keras.Model):
            args = _inputs_and_outputs(args[0])
        super().__init__(*args, **kwargs)
        if num_particles is not None and (
            isinstance(num_particles, bool)
            or not isinstance(num_particles, int)
            or num_particles < 1
        ):
            raise ValueError(f"num_particles must be a positive integer; got {num_particles!r}.")
        self._expected_num_particles = num_particles
        self.likelihood = None if likelihood is None else likelihoods_lib.get(likelihood)
        self.dataset_size = None
        self._dataset_size_given = dataset_size is not None  # else re-inferred from each fit's data
        if dataset_size is not None:
            self.set_dataset_size(dataset_size)
        self.temperature = check_number(temperature, "temperature")
        self._likelihood_built = False
        self._particle_slices = None  # particle-parallel training (compile(parallel="particles"))
        # nll, ParticleMetrics, the optimizer's reported metrics
        self._bayesian_metrics = ModelMetrics()
        self._skipped = keras.Variable(0, dtype="int32", trainable=False, name="skipped_steps")
        # Keys the labels sampled for true-Fisher curvature, with the optimizer's step: saved with the
        # model, so a resumed run draws what an uninterrupted one would (seeded by keras' set_random_seed).
        self._label_seed = keras.Variable(
            random.randint(0, 2**31 - 1), dtype="int64", trainable=False, name="label_seed"
        )
        # mixed_float16: dynamic loss scaling done here rather than by wrapping the optimizer in a
        # LossScaleOptimizer, so a Bayesian optimizer sees the model directly (docs/architecture.md).
        self._loss_scale = self._loss_scale_good_steps = None
        if self.dtype_policy.name == "mixed_float16":
            self._loss_scale = keras.Variable(
                2.0**15, dtype="float32", trainable=False, name="loss_scale"
            )
            self._loss_scale_good_steps = keras.Variable(
                0, dtype="int32", trainable=False, name="loss_scale_good_steps"
            )
        if (
            getattr(self, "_is_graph_network", False)
            or hasattr(self, "outputs")
            and self.outputs is not None
        ):
            self._check_structure()

    # -- structure -----------------------------------------------------------------------------
    @property
    def skipped_steps(self):
        """Training steps skipped since the model was built because the loss or a gradient was NaN/Inf
        (the particles were left unchanged; fit also warns)."""
        return int(self._skipped.numpy())

    @property
    def parallel(self):
        """How training splits over a strategy's replicas: "particles" (compile(parallel="particles") under
        several replicas) or "data"."""
        return "data" if self._particle_slices is None else "particles"

    @property
    def num_particles(self):
        ns = {
            layer.num_particles for layer in self.particle_layers if layer.num_particles is not None
        }
        if len(ns) > 1:
            raise ValueError(
                f"The model's particle layers disagree on the number of particles: {sorted(ns)}."
            )
        if ns:
            return ns.pop()
        return self._expected_num_particles

    @property
    def particle_variables(self):
        return [v for layer in self.particle_layers for v in layer.particle_variables]

    def _check_structure(self):
        outputs = getattr(self, "outputs", None)
        if not outputs:
            return
        if len(outputs) != 1:
            raise ValueError(f"BayesianModel supports one output tensor; got {len(outputs)}.")
        if not self.particle_layers:
            raise ValueError(
                "BayesianModel needs at least one bayes_keras particle layer (e.g. bayes_keras.layers.Dense)."
            )
        received = check_layers_keep_particles(self.operations, ParticleLayer)
        # a random layer draws per particle only where it receives particles
        for layer in self.operations:
            if hasattr(layer, "receives_particles"):
                layer.receives_particles = id(layer) in received
        n = self.num_particles
        if self._expected_num_particles is not None and n != self._expected_num_particles:
            raise ValueError(
                f"num_particles={self._expected_num_particles} was given, but the layers were built "
                f"with {n} particles."
            )
        shape = tuple(outputs[0].shape)
        if len(shape) < 2 or shape[1] != n:
            raise ValueError(
                f"BayesianModel outputs must be (batch, particles={n}, ...); got {shape}."
            )
        if self.likelihood is not None:
            check_output_activation(self.layers[-1], self.likelihood)
            self._likelihood_built = False
            self._build_likelihood(shape)  # its variables must exist before the optimizer is built

    def set_dataset_size(self, dataset_size):
        if (
            isinstance(dataset_size, bool)
            or not isinstance(dataset_size, (int, np.integer))
            or dataset_size < 1
        ):
            raise ValueError(
                f"dataset_size must be a positive integer (number of training examples); got {dataset_size!r}."
            )
        if self.dataset_size != int(dataset_size):
            self.dataset_size = int(dataset_size)
            # the size is a constant of the traced steps
            self.train_function = self.test_function = None

    # -- compile / fit -------------------------------------------------------------------------
    def compile(
        self,
        optimizer="rmsprop",
        loss=None,
        metrics=None,
        likelihood=None,
        dataset_size=None,
        temperature=None,
        parallel="data",
        **kwargs,
    ):
        """As keras.Model.compile, with `likelihood=` instead of a loss (a matching Keras loss name,
        e.g. "sparse_categorical_crossentropy", is accepted and mapped to its likelihood).

        `parallel`: how training splits over the replicas of a tf.distribute strategy (docs/distributed.md):
        "data" (default) gives each replica a share of the global batch and all particles; "particles"
        gives each replica the whole batch and N / replicas of the particles (a functional or Sequential
        model whose particle count the replicas divide, an optimizer without curvature, no float16 loss
        scaling). One device: no difference."""
        if loss is not None:
            if likelihood is not None:
                raise ValueError(
                    "Pass either likelihood= or loss= to BayesianModel.compile, not both."
                )
            try:
                likelihood = likelihoods_lib.get(loss)
            except ValueError:
                if isinstance(loss, keras.losses.Loss):
                    raise  # from_keras_loss says what to change
                raise ValueError(
                    f"BayesianModel trains on a likelihood, not a loss; got loss={loss!r}. Use likelihood="
                    "'categorical' | 'bernoulli' | 'normal' or a bayes_keras.likelihoods object."
                ) from None
        if likelihood is not None:
            self.likelihood = likelihoods_lib.get(likelihood)
            self._likelihood_built = False
            self._check_structure()
        if dataset_size is not None:
            self.set_dataset_size(dataset_size)
            self._dataset_size_given = True
        if temperature is not None:
            self.temperature = check_number(temperature, "temperature")
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            # the model scales the loss itself (mixed_float16)
            optimizer = optimizer.inner_optimizer
        kwargs["auto_scale_loss"] = False
        slow_under_xla = [layer.name for layer in self.particle_layers if not layer.supports_jit]
        if kwargs.get("jit_compile") is True and slow_under_xla:
            warnings.warn(
                f"jit_compile=True: layers {slow_under_xla} run grouped particle convolutions, which "
                "XLA runs many times slower than TensorFlow's own kernels on CPU; training without XLA "
                "(on a GPU, XLA is used).",
                UserWarning,
                stacklevel=2,
            )
            kwargs["jit_compile"] = False
        metrics, particle_metrics = split_metrics(metrics, self.likelihood)
        if "weighted_metrics" in kwargs:
            kwargs["weighted_metrics"], weighted_particle_metrics = split_metrics(
                kwargs["weighted_metrics"], self.likelihood
            )
            # ParticleMetrics always weigh by sample_weight
            particle_metrics += weighted_particle_metrics
        super().compile(optimizer=optimizer, metrics=metrics, **kwargs)
        if self._bayesian_optimizer is None:
            warnings.warn(
                f"BayesianModel compiled with the Keras optimizer {type(self.optimizer).__name__}: every particle then "
                "follows its own gradient of its log joint, i.e. an ensemble of independent MAP fits, not a posterior "
                "approximation. Use a bayes_keras.optimizers method (e.g. GaussianParticleFlow(), SVGD(), MGVBP()), "
                "or IndependentParticles() to ask for the ensemble explicitly.",
                UserWarning,
                stacklevel=2,
            )
        optimizer = self._bayesian_optimizer
        self._particle_slices = self._particle_parallel(parallel, optimizer)
        self._bayesian_metrics.configure(
            particle_metrics, () if optimizer is None else optimizer.reported_metrics
        )
        if optimizer is not None and self.num_particles is not None:
            optimizer.check_num_particles(self.num_particles)

    def _particle_parallel(self, parallel, optimizer):
        """The model at N / replicas particles that particle-parallel training runs, or None."""
        if parallel not in ("data", "particles"):
            raise ValueError(f"parallel must be 'data' or 'particles'; got {parallel!r}.")
        distribute.check_strategy(self.distribute_strategy)
        distribute.own_collective_keys(self.distribute_strategy)
        if (
            tf.distribute.has_strategy()
            and tf.distribute.get_strategy().num_replicas_in_sync > 1
            and self.variables
            and not isinstance(self.variables[0].value, tf.distribute.DistributedValues)
        ):
            raise ValueError(
                f"The model was built outside the {type(tf.distribute.get_strategy()).__name__}'s scope, so its "
                "variables are not mirrored and it would train on one device: create the model inside "
                "`with strategy.scope():` (compiling there too, or later, is fine)."
            )
        replicas = self.distribute_strategy.num_replicas_in_sync
        if parallel == "data" or replicas == 1:
            return None
        if optimizer is not None and optimizer.curvature_request is not None:
            raise ValueError(
                f"parallel='particles' does not gather curvature records across particles yet; "
                f"{optimizer.method_name} asks for {optimizer.curvature_request.statistics}. Use "
                "parallel='data'."
            )
        if self._loss_scale is not None:
            raise ValueError(
                "parallel='particles' does not support mixed_float16 loss scaling yet; use "
                "parallel='data', or the mixed_bfloat16 policy."
            )
        if not self.built or self.num_particles is None:
            raise ValueError(
                "parallel='particles' needs a built model (a functional or Sequential BayesianModel)."
            )
        with self.distribute_strategy.scope():
            return ParticleSlices(self, replicas)

    def fit(
        self,
        x=None,
        y=None,
        batch_size=None,
        epochs=1,
        *args,
        dataset_size=None,
        callbacks=None,
        refresh_batch_norm=True,
        **kwargs,
    ):
        """As keras.Model.fit. `dataset_size` (number of training examples) is taken from here, from
        compile(), or inferred: len(x) for arrays, a counting pass for a finite tf.data.Dataset.

        `refresh_batch_norm` (default True): when training ends, the BatchNormalization layers' moving
        statistics are recomputed for the final weights from up to 4,096 training inputs (one pass over them
        at inference cost, the BatchNormalization layers normalising with batch statistics as in training;
        `refresh_batch_norm`, the method, says more and offers the exact layer-by-layer computation). The
        running averages lag weights that a posterior method keeps moving; False keeps them, as Keras does.
        Inputs a Python generator yields cannot be read twice: they keep the running averages. The refresh
        runs once, when training ends, so the `val_*` figures of every epoch (the last included) and
        checkpoints written during fit (e.g. by keras.callbacks.ModelCheckpoint) used the running averages,
        while the returned model uses the refreshed statistics: call model.evaluate(x_val, y_val) after fit
        to score it."""
        if not isinstance(refresh_batch_norm, bool):
            raise ValueError(
                f"fit: refresh_batch_norm must be True or False; got {refresh_batch_norm!r}."
            )
        if not getattr(self, "compiled", False):
            raise ValueError(
                "You must call compile() before fit(): e.g. "
                "model.compile(optimizer=bayes_keras.optimizers.GaussianParticleFlow())."
            )
        call_checks.batch_size(batch_size)
        call_checks.epochs(epochs, kwargs.get("initial_epoch", 0))
        call_checks.validation_split(kwargs.get("validation_split"))
        call_checks.sample_weight(kwargs.get("sample_weight"))
        callbacks = call_checks.callbacks(callbacks)
        call_checks.class_weight(kwargs.get("class_weight"), self)
        call_checks.flags(kwargs.get("verbose", "auto"), kwargs.get("shuffle", True), "fit")
        call_checks.not_empty(x, "fit")
        call_checks.inputs(self, x, "fit")
        call_checks.targets(x, y, "fit")
        call_checks.target_values(self, y, "fit")
        call_checks.validation_data(self, kwargs.get("validation_data"))
        call_checks.non_finite_inputs(x, "fit")
        if self.parallel == "particles" or self.distribute_strategy.num_replicas_in_sync > 1:
            call_checks.random_layers(
                self,
                "fit",
                "particle parallel"
                if self.parallel == "particles"
                else f"{self.distribute_strategy.num_replicas_in_sync} replicas",
            )
        call_checks.steps(
            x, kwargs.get("steps_per_epoch"), "fit", "steps_per_epoch", warn_unknown=False
        )
        if dataset_size is not None:
            self.set_dataset_size(dataset_size)
            self._dataset_size_given = True
        elif not self._dataset_size_given:  # this fit's data, not an earlier fit's
            self.set_dataset_size(
                _infer_dataset_size(
                    x, kwargs.get("validation_split", 0.0), kwargs.get("steps_per_epoch")
                )
            )
        if self._dataset_size_given and call_checks.in_memory(x):
            rows = _training_rows(
                int(np.shape(tf.nest.flatten(x)[0])[0]), kwargs.get("validation_split", 0.0)
            )
            if self.dataset_size < rows:
                warnings.warn(
                    f"fit: dataset_size={self.dataset_size} is below the {rows} training examples given: the "
                    "likelihood is scaled as if there were fewer examples than it sees, so the prior weighs "
                    "more than the data warrant. If that is meant (tempering), temperature= says it "
                    "directly; otherwise leave dataset_size out (it is inferred).",
                    UserWarning,
                    stacklevel=2,
                )
        if self.likelihood is not None and self.likelihood.adapt_pending:
            self.likelihood.adapt(
                _training_targets(
                    x, y, kwargs.get("validation_split", 0.0), kwargs.get("steps_per_epoch")
                )
            )
        if (
            self.optimizer is not None
            and not self.optimizer.built
            and self.built
            and self.trainable_variables
        ):
            # Build before tracing, so optimizers that initialise from the weights see their values
            # (a subclassed model not yet called is built, with its optimizer, by Keras' fit).
            # mirrored state under tf.distribute, as the model's
            with self.distribute_strategy.scope():
                self.optimizer.build(self.trainable_variables)
        if self._bayesian_optimizer is not None and self._bayesian_optimizer.built:
            self._bayesian_optimizer.check_particles()
        callbacks = callbacks + [_NonFiniteStepWarning(self)]
        history = super().fit(x, y, batch_size, epochs, *args, callbacks=callbacks, **kwargs)
        if refresh_batch_norm and batch_norm_layers(self) and not hasattr(x, "__next__"):
            self.refresh_batch_norm(
                _training_inputs(x, kwargs.get("validation_split", 0.0)), batch_size
            )
        return history

    def bayesian_gradients(self, x, y, sample_weight=None, optimizer="compiled"):
        """One forward and backward pass: (grads, step) for `optimizer.apply(grads,
        model.trainable_variables, step)`, the pieces of train_step for custom training loops.

        grads are the gradients of the negative tempered log joint (per particle for particle variables,
        the particle mean for shared ones), aligned with `model.trainable_variables` (None where a
        variable does not reach the loss); step is the `bayes_keras.optimizers.StepInfo` the optimizer
        needs (log likelihood and prior per particle, curvature records it asked for, its noise).
        `optimizer`: whose curvature request and noise the pass serves: "compiled" (default), another
        BayesianOptimizer, or None (neither: plain gradients and log likelihoods, as an outer
        procedure such as bayes_keras.refinement needs).

        Example (equals fit, step for step):
            >>> @tf.function
            ... def train(x, y):
            ...     grads, step = model.bayesian_gradients(x, y)
            ...     model.optimizer.apply(grads, model.trainable_variables, step)
        """
        if optimizer == "compiled":
            optimizer = self._bayesian_optimizer
        elif optimizer is not None and not isinstance(optimizer, BayesianOptimizer):
            raise ValueError(
                f"bayesian_gradients: optimizer must be 'compiled', a BayesianOptimizer or None; got "
                f"{optimizer!r}."
            )
        if any(
            isinstance(t, tf.distribute.DistributedValues)
            for t in tf.nest.flatten((x, y, sample_weight))
        ):
            raise ValueError(
                "bayesian_gradients got distributed batches (PerReplica values): call it inside "
                "strategy.run(step, args=(x, y)), which hands each replica its share (see "
                "docs/distributed.md, the custom loop)."
            )
        replicas = distribute.num_replicas()
        particle_parallel = self._particle_parallel_active()
        if replicas > 1:  # what fit refuses, the custom loop refuses too
            how = "particle parallel" if particle_parallel else f"{replicas} replicas"
            call_checks.random_layers(self, "bayesian_gradients", how)
        if particle_parallel:
            x, y, sample_weight = distribute.gather_batch((x, y, sample_weight))
        return self._gradients(x, y, sample_weight, optimizer)[:2]

    def refresh_batch_norm(
        self, x, batch_size=None, max_examples=DEFAULT_MAX_EXAMPLES, layerwise=False
    ):
        """Recompute the BatchNormalization layers' moving mean and variance, per particle, for the current
        weights, from up to `max_examples` of the inputs `x` (arrays, tf.data.Dataset, PyDataset; evenly
        spaced examples of arrays), weights unchanged, every other layer in inference mode (no dropout): each
        statistic is the population mean E[x] or variance E[x^2] - E[x]^2 of the layer's inputs, pooled over
        every example and position in float64.

        `layerwise=False` (default, what fit() runs when training ends): one pass, in which the
        BatchNormalization layers normalise with their batch's statistics, as in training (SWA's bn_update;
        the moving averages are not updated by the pass). `layerwise=True`: exact for inference, one
        inference pass per BatchNormalization layer, layer k's inputs computed with the layers before it
        already using their refreshed statistics (what inference feeds it), at a cost that grows with the
        number of layers. See bayes_keras.training.batch_norm_refresh.refresh_batch_norm. Returns the number of
        examples used."""
        return refresh_batch_norm(self, x, batch_size, max_examples, layerwise=layerwise)

    def predict(self, x, batch_size=None, *args, **kwargs):
        """As keras.Model.predict: the posterior predictive summary (probabilities for classification; the
        mean and sd for regression)."""
        call_checks.batch_size(batch_size)
        call_checks.not_empty(x, "predict")
        call_checks.inputs(self, x, "predict")
        call_checks.steps(x, kwargs.get("steps"), "predict")
        warned = call_checks.non_finite_inputs(x, "predict")
        predictions = super().predict(x, batch_size, *args, **kwargs)
        # NaN / Inf in a dataset's inputs give NaN predictions: counted on the result, so the compiled predict step
        # is Keras' own
        if not warned and any(
            np.isnan(p).any()
            for p in tf.nest.flatten(predictions)
            if np.issubdtype(np.asarray(p).dtype, np.floating)
        ):
            warnings.warn(
                "predict: some predictions are NaN: x holds NaN / Inf values, or the weights are not "
                "finite (predict_particles counts the inputs' NaN / Inf values).",
                RuntimeWarning,
                stacklevel=2,
            )
        return predictions

    def evaluate(self, x=None, y=None, *args, **kwargs):
        """As keras.Model.evaluate. Before the training-set size is known (no fit, no dataset_size=), "loss"
        takes the evaluated data as the training set (its size scales the prior term) for this call."""
        call_checks.batch_size(kwargs.get("batch_size", args[0] if args else None))
        call_checks.sample_weight(kwargs.get("sample_weight"))
        call_checks.not_empty(x, "evaluate")
        call_checks.inputs(self, x, "evaluate")
        call_checks.targets(x, y, "evaluate")
        call_checks.target_values(self, y, "evaluate")
        call_checks.non_finite_inputs(x, "evaluate")
        call_checks.steps(x, kwargs.get("steps"), "evaluate")
        if self.dataset_size is not None:
            return super().evaluate(x, y, *args, **kwargs)
        self.set_dataset_size(_infer_dataset_size(x))
        try:
            return super().evaluate(x, y, *args, **kwargs)
        finally:
            self.dataset_size = None
            self.train_function = self.test_function = None

    def initialize_particles(self, center, noise_std=0.1, seed=None, noise_floor=0.01):
        """Place every particle at `center` plus Gaussian noise of standard deviation `noise_std` times each
        weight tensor's root mean square (at least `noise_floor`), e.g. around MAP weights.

        `center` is a Keras model of the same architecture with ordinary layers (e.g. a trained
        deterministic network) or a list of arrays in layer order (kernel, bias per layer).
        Shared (deterministic) weights are set to the center exactly. See
        `bayes_keras.training.particle_initialization.initialize_particles`.
        """
        initialize_particles(self.particle_layers, center, noise_std, seed, noise_floor)


def _functional_arguments(args, kwargs):
    """Whether a Model is constructed the functional way (keras' own test of its arguments), or from a
    built Keras model (e.g. a Sequential of particle layers) whose inputs and outputs it takes."""
    return (
        len(args) == 2
        or (len(args) == 1 and "outputs" in kwargs)
        or ("inputs" in kwargs and "outputs" in kwargs)
        or (len(args) == 1 and isinstance(args[0], keras.Model))
    )


def _inputs_and_outputs(model):
    try:
        return model.inputs, model.outputs
    except (AttributeError, ValueError):
        pass
    raise ValueError(
        f"BayesianModel({type(model).__name__}) takes the model's inputs and outputs, but '{model.name}' has "
        "no defined input: start it with keras.Input(shape) (e.g. keras.Sequential([keras.Input((8,)), "
        "...]))."
    )


_FUNCTIONAL_CLASSES = {}


def _functional_class(cls):
    """`cls` with Functional among its bases (one class per cls), saved under cls's registered name."""
    if cls not in _FUNCTIONAL_CLASSES:
        functional = type(
            f"Functional{cls.__name__}", (cls, Functional), {"__module__": cls.__module__}
        )
        name = keras.saving.get_registered_name(cls)
        package, _, short = name.rpartition(">")
        # registered (BayesianModel is): the functional form saves and loads under that name
        if package:
            functional = keras.saving.register_keras_serializable(package=package, name=short)(
                functional
            )
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
        updates = (
            0
            if optimizer is None or not optimizer.built
            else int(optimizer.skipped_updates.numpy())
        )
        return self._bayesian_model.skipped_steps, updates

    def on_train_begin(self, logs=None):
        self._seen = self._counts()

    def on_train_batch_end(self, batch, logs=None):
        counts = self._counts()
        steps, updates = (now - before for now, before in zip(counts, self._seen))
        if steps:
            warnings.warn(
                f"BayesianModel: {steps} training step(s) skipped because the loss or a gradient "
                "was NaN/Inf (a NaN or Inf in the batch, a negative sample weight, or too large a learning rate); the "
                "particles were left unchanged. Check the data and lower the learning rate.",
                RuntimeWarning,
                stacklevel=2,
            )
        updates -= steps  # a step refused for its loss is also refused by the optimizer's guard
        if updates > 0:
            optimizer = self._bayesian_model.optimizer
            warnings.warn(
                f"{optimizer.method_name}: {updates} update(s) skipped because the new particles or posterior "
                "state were not finite or a condition of the method failed (e.g. a NaN or too large learning "
                "rate, an exploding gradient, a singular curvature); the particles and the optimizer's state "
                "were left unchanged. Lower the learning rate.",
                RuntimeWarning,
                stacklevel=2,
            )
        self._seen = counts


def _infer_dataset_size(x, validation_split=0.0, steps_per_epoch=None):
    """The number of training examples in what Keras' fit accepts, exactly where it is knowable: arrays
    (less the validation split), a tf.data.Dataset of known cardinality (a counting pass), a
    keras.utils.PyDataset with a length ((len - 1) x the first batch's size + the last batch's size). For a
    dataset of unknown length read `steps_per_epoch` batches at a time, steps_per_epoch x its first batch's
    size, an upper bound, with a warning. Otherwise a ValueError saying to pass dataset_size=."""
    if x is None:
        raise ValueError("Unknown training-set size: pass dataset_size= to compile() or fit().")
    if isinstance(x, tf.data.Dataset):
        card = int(x.cardinality())
        if card < 0:
            if steps_per_epoch:
                return _upper_bound(steps_per_epoch, _batch_size(next(iter(x.take(1)))))
            raise ValueError(
                "Cannot infer the training-set size from an infinite or unknown-length "
                "tf.data.Dataset: pass dataset_size= to fit() or compile()."
            )

        def count(acc, batch):
            first = tf.nest.flatten(batch)[0]
            return acc + tf.cast(tf.shape(first)[0], tf.int64)

        return _nonempty(int(x.reduce(tf.constant(0, tf.int64), count)))
    if isinstance(x, keras.utils.PyDataset):
        batches = x.num_batches
        if batches is None:
            if steps_per_epoch:
                return _upper_bound(steps_per_epoch, _batch_size(x[0]))
            raise ValueError(
                f"Cannot infer the training-set size from {type(x).__name__}, a PyDataset without a "
                "length: pass dataset_size= to fit() or compile()."
            )
        if batches < 1:
            return _nonempty(0)
        return _nonempty((batches - 1) * _batch_size(x[0]) + _batch_size(x[batches - 1]))
    if inspect.isgenerator(x) or isinstance(x, collections.abc.Iterator):
        raise ValueError(
            "Cannot infer the training-set size from a Python generator (reading a batch would consume "
            "it): pass dataset_size= to fit() or compile(). (steps_per_epoch x the batch size is the "
            "number of examples seen per epoch, the training-set size only if an epoch is one pass.)"
        )
    leaves = tf.nest.flatten(x)
    if leaves and hasattr(leaves[0], "shape") and len(leaves[0].shape) > 0:
        n = int(leaves[0].shape[0])
        return _nonempty(_training_rows(n, validation_split))
    raise ValueError(
        f"Cannot infer the training-set size from {type(x).__name__}: pass dataset_size= to fit() "
        "or compile()."
    )


def _batch_size(batch):
    """The number of examples in one batch (x, (x, y) or (x, y, sample_weight); x possibly a structure)."""
    first = tf.nest.flatten(batch)[0]
    return int(np.shape(first)[0])


def _upper_bound(steps_per_epoch, batch_size):
    size = int(steps_per_epoch) * int(batch_size)
    warnings.warn(
        f"BayesianModel: the data's length is unknown, so dataset_size is taken as steps_per_epoch x the "
        f"first batch's size = {steps_per_epoch} x {batch_size} = {size}, an upper bound of the training-set "
        "size (exact only if an epoch is one pass over the data). Pass dataset_size= for the exact size: "
        "it scales the likelihood against the prior.",
        UserWarning,
        stacklevel=3,
    )
    return _nonempty(size)


def _nonempty(size):
    if size < 1:
        raise ValueError(
            "The data has no examples (after validation_split): BayesianModel needs at least one "
            "training example to scale its likelihood."
        )
    return size


def _training_rows(size, validation_split):
    """How many of `size` rows fit trains on: Keras keeps the first floor(size (1 - validation_split))
    (array_slicing.train_validation_split)."""
    return int(math.floor(size * (1.0 - float(validation_split or 0.0))))


def _training_inputs(x, validation_split=0.0):
    """The inputs fit trains on: arrays less the validation split's last rows (as Keras splits), or x."""
    if isinstance(x, (tf.data.Dataset, keras.utils.PyDataset)) or not validation_split:
        return x
    keep = _training_rows(int(np.shape(tf.nest.flatten(x)[0])[0]), validation_split)
    return tf.nest.map_structure(lambda a: a[:keep], x)


def _training_targets(x, y, validation_split=0.0, steps_per_epoch=None):
    """The targets fit trains on, for a likelihood's `adapt`: y's first rows (as Keras splits off
    validation_split), or the targets of a tf.data.Dataset or a PyDataset with a length, of (x, y[,
    sample_weight]) batches (of an infinite dataset, its first epoch's steps_per_epoch batches)."""
    if isinstance(x, tf.data.Dataset):
        if int(x.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
            if not steps_per_epoch:
                raise ValueError(
                    "The likelihood fits constants to the training targets before the first step (e.g. "
                    "Normal's standardisation): an infinite dataset needs steps_per_epoch, or call "
                    "model.likelihood.adapt(y_train) before fit."
                )
            x = x.take(int(steps_per_epoch))
        return x.map(lambda *element: element[1] if len(element) > 1 else element[0][1])
    if isinstance(x, keras.utils.PyDataset) and (x.num_batches is not None or steps_per_epoch):
        batches = x.num_batches if x.num_batches is not None else int(steps_per_epoch)
        return np.concatenate([np.asarray(x[i][1]) for i in range(batches)])
    if y is not None:
        y = np.asarray(y)
        return y[: _training_rows(len(y), validation_split)]
    raise ValueError(
        f"The likelihood fits constants to the training targets before the first step (e.g. "
        f"Normal's standardisation), which fit cannot read from {type(x).__name__}: pass arrays or a "
        "tf.data.Dataset, or call model.likelihood.adapt(y_train) before fit (or use "
        "Normal(standardize=False))."
    )
