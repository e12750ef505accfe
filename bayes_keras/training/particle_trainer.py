"""The training half of BayesianModel: its train and test steps and their metrics (as keras.Model takes its
fit / evaluate machinery from keras' Trainer); predictions are particle_predictor.py's.

`ParticleTrainer` is a mixin of `BayesianModel` only: it reads the model's likelihood, dataset size,
temperature, loss scale and optimizer, which BayesianModel (bayes_keras/model.py) owns and documents.
"""

import contextlib

import keras
import tensorflow as tf

from bayes_keras.training import distribute
from bayes_keras.core.bayesian_optimizer import BayesianOptimizer, StepInfo
from bayes_keras.curvature import capture
from bayes_keras.curvature import records as records_lib
from bayes_keras.layers.base import ParticleLayer
from bayes_keras.training.apply_if_finite import apply_if_finite


class ParticleTrainer:
    """train_step and test_step of a model over N weight sets (see BayesianModel)."""

    @property
    def _bayesian_optimizer(self):
        """The optimizer when it is a BayesianOptimizer; None for a plain Keras optimizer (which then
        steps every particle along its own gradient: a MAP ensemble) or before compile."""
        optimizer = getattr(self, "optimizer", None)
        return optimizer if isinstance(optimizer, BayesianOptimizer) else None

    # -- the step ------------------------------------------------------------------------------
    @property
    def particle_layers(self):
        """The model's bayes_keras particle layers, in the order of its weights."""
        # In the order of the model's weights (Keras' _flatten_layers lists nested layers, e.g. the two
        # directions of a Bidirectional, in reverse), so that per-layer orders agree with get_weights().
        layers = [
            layer
            for layer in self._flatten_layers(include_self=False)
            if isinstance(layer, ParticleLayer)
        ]
        position = {id(v): i for i, v in enumerate(self.weights)}
        return sorted(
            layers,
            key=lambda layer: min(
                (position.get(id(v), len(position)) for v in layer.weights), default=len(position)
            ),
        )

    def _build_likelihood(self, output_shape):
        if self.likelihood is None:
            raise ValueError(
                "BayesianModel needs a likelihood: pass likelihood='categorical' | 'bernoulli' | "
                "'normal' (or a bayes_keras.likelihoods object) to the model or to compile()."
            )
        if not self._likelihood_built:
            self.likelihood.build(self, output_shape)
            self._likelihood_built = True

    def log_prior(self):
        """(N,) log prior of the particle weights and the scalar log prior of shared weights."""
        particle = [layer.log_prior() for layer in self.particle_layers if not layer.deterministic]
        shared = [layer.log_prior() for layer in self.particle_layers if layer.deterministic]
        return tf.add_n(particle), (tf.add_n(shared) if shared else tf.zeros((), self.loss_dtype))

    @property
    def loss_dtype(self):
        """The dtype of log densities, losses and gradients: the variables' dtype (float32 under the
        mixed policies, whose low-precision outputs are cast to it as Keras casts its losses)."""
        return tf.as_dtype(self.dtype_policy.variable_dtype)

    def _log_joint(self, y, outputs, sample_weight, parts=False, global_batch=None):
        """`global_batch`: the number of examples of the step over all replicas (default: this batch's)."""
        loglik = self.likelihood.log_prob(y, outputs)  # (batch, N)
        if sample_weight is not None:
            weight = tf.cast(tf.reshape(sample_weight, (-1, 1)), loglik.dtype)
            # a negative weight would train towards the wrong labels: its loss is NaN, so that a training step
            # is skipped and warned like a corrupt batch (arrays and class_weight are refused before fit)
            loglik = loglik * tf.where(weight < 0, tf.constant(float("nan"), loglik.dtype), weight)
        batch = tf.cast(tf.shape(loglik)[0] if global_batch is None else global_batch, loglik.dtype)
        scale = float(self.dataset_size) / batch
        particle_prior, shared_prior = self.log_prior()
        scaled_loglik = scale * tf.reduce_sum(loglik, axis=0) / self.temperature
        particle_prior = particle_prior / self.temperature
        # (particle parallel: scaled_loglik has this replica's N / R particles, the prior all N)
        if parts:
            return shared_prior / self.temperature, scaled_loglik, particle_prior
        return scaled_loglik + particle_prior, shared_prior / self.temperature

    def _particle_parallel_active(self):
        return self._particle_slices is not None and distribute.num_replicas() > 1

    def _objective(self, y, outputs, sample_weight, global_batch=None, replicas=1):
        """(loss, scaled log likelihood (N,), tempered particle log prior (N,)) with loss = -sum_n log_joint_n
        - N log p(shared weights) / T + N sum(model.losses): its gradient gives each particle slice
        -grad log_joint_n and shared weights N times the particle mean (rescaled in _gradients).

        Under tf.distribute (`replicas` > 1) each replica's loss scales its examples by the global batch
        and carries 1 / replicas of the prior terms, so that the sum over replicas is the loss above."""
        if self.dataset_size is None:
            raise ValueError(
                "Unknown training-set size: pass dataset_size= to the model, compile() or fit()."
            )
        shared_log_prior, scaled_loglik, particle_prior = self._log_joint(
            y, outputs, sample_weight, parts=True, global_batch=global_batch
        )
        n = tf.cast(tf.shape(particle_prior)[0], particle_prior.dtype)  # all N particles
        loss = (
            -tf.reduce_sum(scaled_loglik)
            - (tf.reduce_sum(particle_prior) + n * shared_log_prior) / replicas
        )
        if self.losses:
            loss += n * tf.add_n([tf.cast(term, loss.dtype) for term in self.losses]) / replicas
        return loss, scaled_loglik, particle_prior

    def _gradients(self, x, y, sample_weight, optimizer, reduce_gradients=True):
        """(grads, step, outputs, loss): see bayesian_gradients and _objective. One replica's forward and
        backward pass, then (under tf.distribute) `distribute.reduce_step`, the one place where it becomes the global
        step: the step (log likelihoods, curvature records), the loss, the outputs and the gradients are
        those of the global batch and all N particles (the gradients unless `reduce_gradients=False`: a Keras
        optimizer sums the replicas' gradients itself)."""
        replicas = distribute.num_replicas() if tf.distribute.has_strategy() else 1
        # Particle parallel: this replica runs its slice of the particles on the whole (gathered) batch;
        # data parallel: all particles on its rows of the batch.
        particle_parallel = self._particle_parallel_active()
        forward = self._particle_slices if particle_parallel else self
        # Curvature: only when the optimizer asks; the layers then report their inputs and
        # pre-activations, differentiated in the same backward pass as the weights.
        request = None if optimizer is None else optimizer.curvature_request
        wants_curvature = request is not None
        # True Fisher: a second backward pass (pre-activations only) of labels sampled from the model.
        sampled_labels = wants_curvature and request.samples_labels
        # Computed before the forward pass, off its critical path (see BayesianOptimizer.prepare_step).
        prepared = None if optimizer is None else optimizer.prepare_step()
        with tf.GradientTape(persistent=sampled_labels) as tape:
            with capture.capturing() if wants_curvature else contextlib.nullcontext([]) as records:
                outputs = tf.cast(forward(x, training=True), self.loss_dtype)
            if not particle_parallel:  # (particle parallel: built at compile, at N particles)
                self._build_likelihood(outputs.shape)
            trainable = self.trainable_variables  # after the call: a subclassed model builds in it
            # A subclassed model's first call also builds it through a symbolic call, whose records are
            # not part of this step.
            records = [r for r in records if records_lib.of_this_graph(r.preactivations)]
            local_batch = tf.shape(outputs)[0]
            # (particle parallel: every replica has the whole batch, scaled by its own size)
            rows_split = replicas > 1 and not particle_parallel
            global_batch, first_row = (
                distribute.batch_rows(local_batch) if rows_split else (local_batch, 0)
            )
            loss, scaled_loglik, particle_prior = self._objective(
                y, outputs, sample_weight, global_batch if rows_split else None, replicas
            )
            n = tf.cast(tf.shape(particle_prior)[0], loss.dtype)  # all N particles
            # float16 backward passes differentiate the per-datum loss times a dynamic scale, as Keras
            # scales its (per-example) loss; gradients are unscaled below in the variables' dtype.
            scale = (
                None if self._loss_scale is None else self._loss_scale / float(self.dataset_size)
            )
            scaled_loss = loss if scale is None else loss * scale
            if sampled_labels and records:
                seed = tf.stack([self._label_seed.value, tf.cast(optimizer.iterations, tf.int64)])
                rows = None if replicas == 1 else (global_batch, first_row)
                sampled_loss = records_lib.sampled_labels_loss(
                    self.likelihood, outputs, seed, sample_weight, scale, rows
                )
        grads = tape.gradient(scaled_loss, trainable + [r.preactivations for r in records])
        grads = [
            g if g is None or scale is None else tf.cast(g, self.loss_dtype) / scale for g in grads
        ]
        grads, preactivation_grads = grads[: len(trainable)], grads[len(trainable) :]
        if records:
            sampled_grads = None
            if sampled_labels:
                sampled_grads = tape.gradient(sampled_loss, [r.preactivations for r in records])
                if scale is not None:
                    sampled_grads = [tf.cast(g, self.loss_dtype) / scale for g in sampled_grads]
            records_lib.finish_records(
                records,
                preactivation_grads,
                global_batch,
                self.loss_dtype,
                self.dataset_size,
                self.temperature,
                sampled_grads,
            )
        del tape
        if optimizer is not None and not optimizer.built:
            # A subclassed model is built by its first call (here): its optimizer only now sees the variables.
            with tf.init_scope():  # inside the traced step: create and initialise the state eagerly
                optimizer.build(trainable)
        grads = [
            g if g is None or getattr(v, "is_particle_variable", False) else g / n
            for g, v in zip(grads, trainable)
        ]
        if replicas > 1:  # the one place where a replica's step becomes the global step
            grads, scaled_loglik, loss, outputs = distribute.reduce_step(
                grads, scaled_loglik, loss, outputs, records, reduce_gradients, particle_parallel
            )
        step = StepInfo(
            log_likelihood=tf.stop_gradient(scaled_loglik),
            log_prior=tf.stop_gradient(particle_prior),
            temperature=self.temperature,
            dataset_size=float(self.dataset_size),
            curvature=tuple(records),
            prepared=prepared,
        )
        return grads, step, outputs, loss

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        # each replica: the whole batch, a slice of the particles
        if self._particle_parallel_active():
            x, y, sample_weight = distribute.gather_batch((x, y, sample_weight))
        optimizer = self._bayesian_optimizer
        grads, step, outputs, loss = self._gradients(
            x, y, sample_weight, optimizer, reduce_gradients=optimizer is not None
        )
        if optimizer is not None:
            self._bayesian_metrics.update_method(optimizer.report(step), tf.shape(outputs)[0])
        trainable = self.trainable_variables
        if optimizer is not None and self._loss_scale is None:
            # The optimizer's guard refuses a step whose loss, curvature records or new values are not
            # finite; the model counts the steps refused for their loss or records (skipped_steps).
            self._skipped.assign_add(tf.cast(tf.logical_not(step.finite), self._skipped.dtype))
            optimizer.apply(grads, trainable, step)
        else:  # a plain Keras optimizer (no guard of its own), or float16 loss scaling (see apply_if_finite)
            apply_if_finite(
                lambda given: (
                    self.optimizer.apply(given, trainable)
                    if optimizer is None
                    else optimizer.apply(given, trainable, step)
                ),
                grads,
                loss,
                self._skipped,
                None if optimizer is None else step.finite,
                self._loss_scale,
                self._loss_scale_good_steps,
            )
        return self._update_metrics(x, y, outputs, loss, sample_weight, training=True)

    def test_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        outputs = tf.cast(self(x, training=False), self.loss_dtype)
        self._build_likelihood(outputs.shape)
        loss, _, _ = self._objective(y, outputs, sample_weight)
        return self._update_metrics(x, y, outputs, loss, sample_weight, training=False)

    def _update_metrics(self, x, y, outputs, loss, sample_weight, training):
        """Keras' "loss" (per example: loss / (N dataset_size), weighted by the batch size as Keras weights
        its loss, so the epoch value does not depend on the batch size), "nll" and the ParticleMetrics from
        the per-particle outputs, the compiled metrics from the predictive summary (model.predict's)."""
        batch = tf.shape(outputs)[0]
        if self._loss_tracker is not None:
            n = tf.cast(tf.shape(outputs)[1], loss.dtype)
            per_example = loss / (n * float(self.dataset_size))
            # A step refused for a non-finite loss leaves the particles unchanged and is not part of the epoch's
            # loss (one NaN batch made the whole epoch's reported loss NaN); fit warns that it was skipped.
            # (evaluate reports a NaN)
            finite = tf.math.is_finite(per_example) if training else tf.constant(True)
            self._loss_tracker.update_state(
                tf.where(finite, per_example, tf.zeros_like(per_example)),
                sample_weight=tf.where(
                    finite, tf.cast(batch, per_example.dtype), tf.zeros((), per_example.dtype)
                ),
            )
        self._bayesian_metrics.update_predictive(y, outputs, self.likelihood, sample_weight)
        logs = self.compute_metrics(x, y, outputs, sample_weight)
        # the optimizer's bound is a training objective, not reported on held-out data
        if not training:
            for name in self._bayesian_metrics.reported_method_metrics:
                logs.pop(name, None)
        if not tf.distribute.has_strategy():
            return logs
        if distribute.num_replicas() > 1:
            logs = distribute.results_of_all_replicas(self.metrics, logs)
        if distribute.multi_worker(self.distribute_strategy):
            # Keras' TF trainer averages each worker's logs with strategy.reduce("MEAN", value, axis=0), which
            # fails on scalars ("Invalid reduction dimension 0 for input with 0 dimensions", Keras 3 with
            # MultiWorkerMirroredStrategy, tensorflow/tensorflow#72388); as (1,) tensors they average to scalars.
            logs = {name: tf.reshape(value, (1,)) for name, value in logs.items()}
        return logs

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Keras' TF trainer builds the model, metrics and optimizer from a first batch under a strategy,
        taking the MEAN over replicas of the batch's values, which MultiWorkerMirroredStrategy refuses for
        a PerReplica of its one local device ("unsupported type PerReplica"). Only the batch's shapes
        matter: this takes the first local replica's batch instead."""
        if iterator is None or getattr(self, "_distribute_strategy", None) is None:
            return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)
        strategy = self.distribute_strategy
        for _, _, batches in iterator:
            data_batch = keras.tree.map_structure(
                lambda v: (
                    strategy.experimental_local_results(v)[0]
                    if isinstance(v, tf.distribute.DistributedValues)
                    else v
                ),
                next(batches),
            )
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        """As keras.Model.compute_metrics, with `y_pred` the model's per-particle outputs (batch, N, ...): the
        compiled metrics see the predictive summary (what `predict` returns; the mean for a Normal)."""
        if self.likelihood is None:
            self._build_likelihood(y_pred.shape)  # says to pass likelihood=
        if len(y_pred.shape) >= 2:
            y_pred = self.likelihood.summary(tf.cast(y_pred, self.loss_dtype))
            if isinstance(y_pred, dict):
                y_pred = y_pred["mean"]
        return super().compute_metrics(x, y, y_pred, sample_weight)

    @property
    def metrics_names(self):
        """The names of evaluate()'s values, in its order: "loss", the compiled metrics (once built by a
        first fit / evaluate), then this model's ("nll" and ParticleMetrics, sorted as Keras orders them)."""
        names = ["loss"] if self._loss_tracker is not None else []
        compiled = self._compile_metrics
        if compiled is not None and compiled.built:
            names += [m.name for m in compiled.metrics]
        return names + self._bayesian_metrics.evaluation_names()
