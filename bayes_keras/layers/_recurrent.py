"""Shared machinery of the particle recurrent layers (SimpleRNN, LSTM, GRU).

Layout (docs/architecture.md, "Particle axis"):
    input   (batch, T, F)      on the layer that starts the particle axis (`num_particles=N`),
            (batch, N, T, F)   on every later layer;
    output  (batch, N, units) or, with `return_sequences=True`, (batch, N, T, units).
    weights kernel (N, F, k*units), recurrent_kernel (N, units, k*units), bias (N, k*units)
            (GRU with reset_after: (N, 2, 3*units)); gates in Keras' order (k = 1 SimpleRNN,
            4 LSTM: i, f, c, o; 3 GRU: z, r, h). Deterministic layers drop the N axis.

Where the pre-activations are computed (for curvature / KFAC statistics):
    z_t = x_t W + b_in + h_{t-1} U (+ b_rec for GRU reset_after)
    * INPUT PROJECTION `x_t W + b_in` for ALL time steps at once: `_ParticleRNN._project`, one
      batched matmul with the particle axis as the batch axis, `(N, B*T, F) @ (N, F, k*units)`
      (the first layer: one matmul of `(B*T, F)` against the N kernels concatenated). Its result
      is laid out time-major `(T, N, B, k*units)`.
    * RECURRENT PRE-ACTIVATIONS `h_{t-1} U`: inside the time loop, in each cell's `_step`
      (`_recurrent_matmul`: `(N, B, units) @ (N, units, k*units)`), added to the projected input.
      Exception, GRU with reset_after=False (Keras' reset-before form): the candidate block is
      `(r_t * h_{t-1}) U_h`, so the candidate's recurrent "input" is `r_t * h_{t-1}`, not h_{t-1}.
    W and U are never concatenated, so the input and recurrent Kronecker factors stay separate.

Curvature capture (only inside bayes_keras.curvature.capturing(), i.e. when the optimizer asks):
the layer records its input x and, as its "pre-activations", the projected input x_t W + b_in laid
out (batch, N, T, k*units) (two exact transposes around the time-major tensor, so the gradient of
the loss with respect to it is d(-log p)/d z_t: the projection enters z_t additively). The time loop
then always runs as a scan (the same step function; only the final state is returned when
return_sequences=False), and the record's `extras` get h_{t-1} ("recurrent_inputs", h_{-1} = 0) and
the cell's own extra statistics (GRU: reset gates), recomputed outside the loop from h_{t-1}, all
(batch, N, T, units) in input time order (also for go_backwards). Numerics of the outputs are
unchanged; outside capturing nothing of this runs.

Time loop: `tf.scan` over the time axis (or `tf.foldl` when only the last state is needed), a
graph `while` loop whose body is vectorised over batch and particles, so T may be unknown and the
graph does not grow with T; `unroll=True` (as in Keras) unrolls a Python loop over a static T,
which is faster for very short sequences. There is never a loop over particles.

Deterministic layers with a particle input fold the particle axis into the batch axis and run the
shared weights once; a deterministic first layer runs once and then broadcasts.
"""

import numbers

import keras
import tensorflow as tf

from bayes_keras.training import distribute
from bayes_keras import priors as priors_lib
from bayes_keras.curvature import capture
from bayes_keras.layers.particle_initializers import default_bias_initializer
from bayes_keras.layers.base import ParticleLayer

# Keras RNN arguments that these layers do not implement, with the values that mean "off" (the
# Keras defaults), which are accepted so a Keras layer's config can be passed through unchanged.
_UNSUPPORTED = {
    "stateful": (False,),
    "return_state": (False,),
    "time_major": (False,),
    "kernel_regularizer": (None,),
    "recurrent_regularizer": (None,),
    "bias_regularizer": (None,),
    "kernel_constraint": (None,),
    "recurrent_constraint": (None,),
    "bias_constraint": (None,),
    "use_cudnn": ("auto", False),
    "implementation": (1, 2),  # Keras-internal kernel fusion choice; the math is the same
}


def _pop_unsupported(name, kwargs):
    for key, allowed in _UNSUPPORTED.items():
        if key not in kwargs:
            continue
        value = kwargs.pop(key)
        if not any(value is a or (type(value) is type(a) and value == a) for a in allowed):
            raise ValueError(
                f"bayes_keras.layers.{name} does not support {key}={value!r} (accepted: "
                f"{', '.join(repr(a) for a in allowed)}). State, regularizer and "
                "constraint arguments of keras.layers RNNs are not implemented for particle RNNs."
            )


class _ShiftedInitializer(keras.initializers.Initializer):
    """`inner` plus a constant `shift` on the column block [start, start + size) of the last axis.

    Used for LSTM's unit_forget_bias. Exposes the inner initializer's seed in its config, so the
    per-particle initializer helper draws every particle with its own seed.
    """

    def __init__(self, inner, start, size, shift=1.0, seed=None):
        self.inner = keras.initializers.get(inner)
        if seed is not None:
            self.inner = self.inner.__class__.from_config({**self.inner.get_config(), "seed": seed})
        self.start, self.size, self.shift = int(start), int(size), float(shift)

    def __call__(self, shape, dtype=None):
        value = self.inner(shape, dtype=dtype)
        last = shape[-1]
        mask = tf.concat(
            [
                tf.zeros([self.start]),
                tf.ones([self.size]),
                tf.zeros([last - self.start - self.size]),
            ],
            0,
        )
        return value + tf.cast(self.shift * mask, value.dtype)

    def get_config(self):
        inner = self.inner.get_config()
        config = {
            "inner": keras.initializers.serialize(self.inner),
            "start": self.start,
            "size": self.size,
            "shift": self.shift,
        }
        if "seed" in inner:
            config["seed"] = inner["seed"]
        return config


class _ParticleRNN(ParticleLayer):
    """Base of the particle RNN layers; subclasses define the gates (`_gates`) and the cell step."""

    _gates = 1
    draws_as_one_device = True  # its dropout masks (bayes_keras.training.call_checks.random_layers)

    def __init__(
        self,
        units,
        activation="tanh",
        use_bias=True,
        kernel_initializer="glorot_uniform",
        recurrent_initializer="orthogonal",
        bias_initializer=None,
        *,
        return_sequences=False,
        go_backwards=False,
        unroll=False,
        dropout=0.0,
        recurrent_dropout=0.0,
        seed=None,
        recurrent_prior=None,
        **kwargs,
    ):
        name = type(self).__name__
        _pop_unsupported(name, kwargs)
        super().__init__(**kwargs)
        if isinstance(units, bool) or not isinstance(units, int) or units < 1:
            raise ValueError(f"{name} units must be a positive integer; got {units!r}.")
        self.units = units
        self.activation = keras.activations.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.recurrent_initializer = keras.initializers.get(recurrent_initializer)
        self.bias_initializer = keras.initializers.get(
            default_bias_initializer(bias_initializer, self.deterministic)
        )
        self.return_sequences = bool(return_sequences)
        self.go_backwards = bool(go_backwards)
        self.unroll = bool(unroll)
        for key, rate in (("dropout", dropout), ("recurrent_dropout", recurrent_dropout)):
            if (
                isinstance(rate, bool)
                or not isinstance(rate, numbers.Real)
                or not 0.0 <= rate < 1.0
            ):
                raise ValueError(f"{name} {key} must be a number in [0, 1); got {rate!r}.")
        self.dropout = float(dropout)
        self.recurrent_dropout = float(recurrent_dropout)
        self.seed = seed
        # Only layers that drop anything own a seed generator (a variable), so models without dropout
        # keep the variables they had.
        self.seed_generator = (
            keras.random.SeedGenerator(seed)
            if self.dropout > 0 or self.recurrent_dropout > 0
            else None
        )
        # Default: the kernel prior, as for keras' recurrent_regularizer-less layers.
        self.recurrent_prior = (
            self.kernel_prior if recurrent_prior is None else priors_lib.get(recurrent_prior)
        )
        self.supports_masking = True

    # -- weights -------------------------------------------------------------------------------
    def _bias_shape(self):
        return (self._gates * self.units,)

    def _bias_initializer_for_build(self):
        return self.bias_initializer

    def build(self, input_shape):
        self._resolve_num_particles(input_shape, core_rank=3)
        features = input_shape[-1]
        if features is None:
            raise ValueError(
                f"{type(self).__name__} '{self.name}' needs a known feature dimension; "
                f"got {tuple(input_shape)}."
            )
        width = self._gates * self.units
        self.kernel = self.add_particle_weight(
            "kernel", (features, width), self.kernel_initializer, self.kernel_prior, fan_in=features
        )
        self.recurrent_kernel = self.add_particle_weight(
            "recurrent_kernel",
            (self.units, width),
            self.recurrent_initializer,
            self.recurrent_prior,
            fan_in=self.units,
        )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_particle_weight(
                "bias",
                self._bias_shape(),
                self._bias_initializer_for_build(),
                self.bias_prior,
                fan_in=features,
            )

    def _split_bias(self, bias):
        """(input bias, recurrent bias or None) of one weight set or of the (N, ...) stack."""
        return bias, None

    # -- the cell ------------------------------------------------------------------------------
    def _initial_states(self, h0):
        return (h0,)

    def _step(self, states, xw_t, recurrent_kernel, recurrent_bias, recurrent_keep=None):
        """One time step: `xw_t` = x_t W + b_in (already projected); returns the new states, h first.
        `recurrent_keep` (None, or a 0 / 1/(1-rate) mask broadcastable to h): recurrent dropout, applied to
        h_{t-1} where it enters the recurrent matmuls only (`_dropped`), never to the carried state."""
        raise NotImplementedError

    @staticmethod
    def _dropped(h, recurrent_keep):
        return h if recurrent_keep is None else h * recurrent_keep

    @staticmethod
    def _recurrent_matmul(h, recurrent_kernel):
        # (N, B, units) @ (N, units, k*units) per particle, or (M, units) @ (units, k*units) when shared.
        return tf.matmul(h, recurrent_kernel)

    # -- forward -------------------------------------------------------------------------------
    def _check_rank(self, x):
        rank = len(x.shape)
        expected = 3 if self.broadcasts else 4
        if rank != expected:
            layout = (
                "(batch, time, features)"
                if self.broadcasts
                else "(batch, particles, time, features)"
            )
            raise ValueError(
                f"{type(self).__name__} '{self.name}' expects input {layout}; got shape {tuple(x.shape)}."
            )

    def _loop(
        self, xs, recurrent_kernel, recurrent_bias, sequence=None, mask=None, recurrent_keep=None
    ):
        """Run the recurrence over time-major projected inputs xs (T, *lead, k*units); returns all
        states h (T, *lead, units) in processing order when `sequence` (default: return_sequences),
        else the last one. `mask` (T, *lead broadcastable) bool: at a masked step every state (and so the
        output) keeps its previous value, as in Keras' RNN layers. `recurrent_keep` (*lead, units): the
        recurrent dropout mask, the same at every step (see `_step`)."""
        sequence = self.return_sequences if sequence is None else sequence
        lead = tf.shape(xs)[1:-1]
        h0 = tf.zeros(tf.concat([lead, [self.units]], 0), dtype=xs.dtype)
        states0 = self._initial_states(h0)
        if self.go_backwards:
            xs = tf.reverse(xs, [0])  # outputs stay in processing order, as in Keras
            mask = None if mask is None else tf.reverse(mask, [0])

        def cell(states, xw_t):
            return self._step(states, xw_t, recurrent_kernel, recurrent_bias, recurrent_keep)

        if mask is None:
            step = cell
        else:
            xs = (xs, tf.broadcast_to(mask, tf.shape(xs)[:-1])[..., None])

            def step(states, inputs):
                xw_t, keep_t = inputs
                new = cell(states, xw_t)
                return tuple(tf.where(keep_t, n, o) for n, o in zip(new, states))

        if self.unroll:
            steps = tf.nest.flatten(xs)[0].shape[0]
            if steps is None:
                raise ValueError(
                    f"{type(self).__name__} '{self.name}': unroll=True needs a static number of "
                    "time steps."
                )
            states, outputs = states0, []
            for t in range(steps):
                states = step(states, tf.nest.map_structure(lambda a: a[t], xs))
                outputs.append(states[0])
            return tf.stack(outputs, 0) if sequence else states[0]
        if sequence:
            return tf.scan(step, xs, initializer=states0)[0]  # (T, *lead, units)
        return tf.foldl(step, xs, initializer=states0)[0]  # (*lead, units)

    def _project(self, x):
        """Particle input projection for all time steps: (batch, [N,] T, F) -> (T, N, batch, k*units)."""
        n, width = self.num_particles, self._gates * self.units
        kernel = tf.convert_to_tensor(self.kernel)  # (N, F, width)
        if len(x.shape) == 3:  # one input for all particles (the first layer without input dropout)
            # One matmul of (B*T, F) against the N kernels side by side: (F, N*width).
            k = tf.reshape(tf.transpose(kernel, [1, 0, 2]), (-1, n * width))
            xw = tf.tensordot(x, k, axes=[[-1], [0]])  # (B, T, N*width)
            shape = tf.shape(xw)
            xw = tf.reshape(xw, tf.stack([shape[0], shape[1], n, width]))
            return tf.transpose(xw, [1, 2, 0, 3])
        shape = tf.shape(x)
        xt = tf.reshape(tf.transpose(x, [1, 0, 2, 3]), tf.stack([n, -1, shape[3]]))  # (N, B*T, F)
        xw = tf.matmul(xt, kernel)  # (N, B*T, width): particle axis = matmul batch axis
        xw = tf.reshape(xw, tf.stack([n, shape[0], shape[2], width]))
        return tf.transpose(xw, [2, 0, 1, 3])

    def _run_particles(self, x, mask=None, input_keep=None, recurrent_keep=None):
        n, width = self.num_particles, self._gates * self.units
        # (B, N, F), the same at every step; a first layer's x gains the N axis
        if input_keep is not None:
            x = (x[:, None] if len(x.shape) == 3 else x) * input_keep[:, :, None, :]
        xs = self._project(x)  # (T, N, B, width)
        recurrent_bias = None
        if self.bias is not None:
            b_in, b_rec = self._split_bias(tf.convert_to_tensor(self.bias))  # (N, width) each
            xs = xs + tf.reshape(b_in, (1, n, 1, width))
            if b_rec is not None:
                recurrent_bias = tf.reshape(b_rec, (n, 1, width))
        recurrent_kernel = tf.convert_to_tensor(self.recurrent_kernel)
        if mask is not None:  # (B, T) or (B, N, T) -> time-major (T, 1 or N, B)
            mask = tf.transpose(mask[:, None, :] if len(mask.shape) == 2 else mask, [2, 1, 0])
        if recurrent_keep is not None:
            # (B, N, u) -> (N, B, u), as the states
            recurrent_keep = tf.transpose(recurrent_keep, [1, 0, 2])
        if capture.is_capturing():
            h = self._loop_recorded(x, xs, recurrent_kernel, recurrent_bias, mask, recurrent_keep)
        else:
            h = self._loop(
                xs, recurrent_kernel, recurrent_bias, mask=mask, recurrent_keep=recurrent_keep
            )
        if self.return_sequences:
            return tf.transpose(h, [2, 1, 0, 3])  # (T, N, B, u) -> (B, N, T, u)
        return tf.transpose(h, [1, 0, 2])  # (N, B, u) -> (B, N, u)

    def _loop_recorded(
        self, x, xs, recurrent_kernel, recurrent_bias, mask=None, recurrent_keep=None
    ):
        """`_loop` under curvature capture (see the module docstring): records x (after input dropout), the
        projected input (B, N, T, width) and, in `extras`, h_{t-1} as it enters the recurrent matmul (after
        recurrent dropout) and the cell's statistics."""
        xs_b = tf.transpose(xs, [2, 1, 0, 3])  # (T, N, B, w) -> (B, N, T, w): exact
        rec = capture.record(self, x, xs_b)
        xs = tf.transpose(xs_b, [2, 1, 0, 3])
        hs = self._loop(
            xs,
            recurrent_kernel,
            recurrent_bias,
            sequence=True,
            mask=mask,
            recurrent_keep=recurrent_keep,
        )  # (T, N, B, u), processing order
        h_prev = self._dropped(
            tf.stop_gradient(tf.concat([tf.zeros_like(hs[:1]), hs[:-1]], 0)), recurrent_keep
        )
        xs_proc = tf.stop_gradient(tf.reverse(xs, [0]) if self.go_backwards else xs)
        extras = {"recurrent_inputs": h_prev}
        extras.update(self._curvature_statistics(xs_proc, h_prev, recurrent_kernel, recurrent_bias))
        for key, value in extras.items():
            if self.go_backwards:
                value = tf.reverse(value, [0])  # back to input time order
            extras[key] = tf.transpose(value, [2, 1, 0, 3])  # (B, N, T, u)
        rec.extras = extras
        return hs if self.return_sequences else hs[-1]

    def _curvature_statistics(self, xs, h_prev, recurrent_kernel, recurrent_bias):
        """Extra per-step tensors (T, N, B, units) KFAC needs besides h_{t-1}, from the time-major
        projected inputs and previous states in processing order (GRU: its reset gates)."""
        return {}

    def _run_shared(self, x, mask=None, input_keep=None, recurrent_keep=None):
        """Shared weights on (M, T, F) -> (M, [T,] units); mask (M, T); dropout masks (M, F) and (M, units)."""
        if input_keep is not None:
            x = x * input_keep[:, None, :]
        xw = tf.tensordot(x, tf.convert_to_tensor(self.kernel), axes=[[-1], [0]])  # (M, T, width)
        recurrent_bias = None
        if self.bias is not None:
            b_in, recurrent_bias = self._split_bias(tf.convert_to_tensor(self.bias))
            xw = xw + b_in
        mask = None if mask is None else tf.transpose(mask)  # (T, M)
        h = self._loop(
            tf.transpose(xw, [1, 0, 2]),
            tf.convert_to_tensor(self.recurrent_kernel),
            recurrent_bias,
            mask=mask,
            recurrent_keep=recurrent_keep,
        )
        return tf.transpose(h, [1, 0, 2]) if self.return_sequences else h

    def _dropout_masks(self, x, training):
        """(input_keep (B, N, F), recurrent_keep (B, N, units)), each None when that dropout is off: one
        mask per sequence and particle, the same at every time step (variational RNN dropout, Gal &
        Ghahramani 2016, https://arxiv.org/abs/1512.05287; one mask for all gates, as Keras' default
        implementation); drawn in training only."""
        if not training or self.seed_generator is None:
            return None, None
        shape = tf.shape(x)

        def keep(rate, width):
            if rate == 0.0:
                return None

            # Under tf.distribute: drawn for the global batch (and every particle), this replica's rows (or
            # particles) kept, as one device draws.
            def draw(batch):
                particles = distribute.particles_drawn(self, self.num_particles)
                mask = keras.random.dropout(
                    tf.ones(tf.stack([batch, particles, width]), x.dtype),
                    rate,
                    seed=self.seed_generator,
                )
                return distribute.particle_columns(self, mask, self.num_particles)

            if distribute.particle_slice_of(self) is not None:  # particle parallel: the whole batch
                return draw(shape[0])
            return distribute.replica_rows(draw, shape[0])

        return keep(self.dropout, x.shape[-1]), keep(self.recurrent_dropout, self.units)

    def call(self, inputs, mask=None, training=None):
        """`mask`: (batch, time) or (batch, particles, time) bool, e.g. from Embedding(mask_zero=True)."""
        x = tf.convert_to_tensor(inputs)
        self._check_rank(x)
        if mask is not None:
            mask = tf.cast(mask, tf.bool)
        input_keep, recurrent_keep = self._dropout_masks(x, training)
        if not self.deterministic:
            return self._run_particles(x, mask, input_keep, recurrent_keep)
        if self.broadcasts and input_keep is None and recurrent_keep is None:
            return self._broadcast_shared(self._run_shared(x, mask))
        # every particle gets its own dropout masks: the shared weights run N times
        if self.broadcasts:
            x = tf.tile(x[:, None], [1, self.num_particles, 1, 1])
        shape = tf.shape(x)
        if mask is not None:  # (B, [N,] T) -> (B * N, T), particles folded into the batch as x is
            mask = tf.reshape(
                tf.broadcast_to(mask[:, None, :] if len(mask.shape) == 2 else mask, shape[:3]),
                (-1, shape[2]),
            )
        fold = lambda keep: None if keep is None else tf.reshape(keep, (-1, keep.shape[-1]))  # noqa: E731
        y = self._run_shared(
            tf.reshape(x, tf.concat([[-1], shape[2:]], 0)),
            mask,
            fold(input_keep),
            fold(recurrent_keep),
        )  # particles folded into batch
        return tf.reshape(y, tf.concat([shape[:2], tf.shape(y)[1:]], 0))

    def compute_mask(self, inputs, mask=None):
        return mask if self.return_sequences else None

    def compute_output_shape(self, input_shape):
        if self.broadcasts:
            batch, n, steps = input_shape[0], self._given_num_particles, input_shape[1]
        else:
            batch, n, steps = input_shape[0], input_shape[1], input_shape[2]
        if self.return_sequences:
            return (batch, n, steps, self.units)
        return (batch, n, self.units)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "activation": keras.activations.serialize(self.activation),
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "recurrent_initializer": keras.initializers.serialize(self.recurrent_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
                "return_sequences": self.return_sequences,
                "go_backwards": self.go_backwards,
                "unroll": self.unroll,
                "dropout": self.dropout,
                "recurrent_dropout": self.recurrent_dropout,
                "seed": self.seed,
                "recurrent_prior": priors_lib.serialize(self.recurrent_prior),
            }
        )
        return config
