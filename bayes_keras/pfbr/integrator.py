"""Fixed-step ODE integration of a particle flow together with the particles' log densities.

Chen, Dai & Song 2019, Particle Flow Bayes' Rule (https://arxiv.org/abs/1902.00640), Theorem 2.1: along
dx/dt = f(x, t) the density of the moving particles obeys d log q(x(t), t) / dt = -div_x f(x(t), t), so

    log q_T(x(T)) = log q_0(x(0)) - integral_0^T div_x f(x(t), t) dt.

The augmented state (x, log q) is integrated with the classical fourth-order Runge-Kutta rule on a fixed
grid (a fixed step count keeps the graph, its gradient and XLA compilation predictable; the authors'
released code also uses a fixed-grid RK4 for these experiments). The steps run in a `tf.while_loop`, so
a traced graph holds one step whatever `steps` is.
"""

import tensorflow as tf


def brute_force_divergence(velocity, x, t):
    """trace(d velocity / dx) per row of x by a full Jacobian (`batch_jacobian`, d reverse passes):
    the reference the operator's own divergences are tested against. velocity(x, t): (M, d) -> (M, d)."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        f = velocity(x, t)
    return tf.linalg.trace(tape.batch_jacobian(f, x))


def hutchinson_divergence(velocity, x, t, probe):
    """velocity(x, t) and Hutchinson's unbiased estimate probe^T (d velocity / dx) probe per row
    (E[probe probe^T] = I): one reverse pass whatever d is."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        f = velocity(x, t)
    vjp = tape.gradient(f, x, output_gradients=probe)
    return f, tf.reduce_sum(vjp * probe, axis=-1)


def integrate_flow(field, x, log_density=None, *, time_length=1.0, steps=5):
    """Moves the rows of `x` (M, d) along dx/dt = f(x, t) for t in [0, time_length] by `steps` RK4 steps,
    and `log_density` (M,), if given, by d log q / dt = -div f (Theorem 2.1).

    `field(x, t, with_divergence)` returns (f, div f) (div None when with_divergence is False).
    Returns (x_T, log_density_T), log_density_T None when no log density was given (and then no
    divergence is computed).
    """
    dt = tf.cast(float(time_length) / int(steps), x.dtype)
    track = log_density is not None

    def derivative(x_now, t):
        f, div = field(x_now, t, track)
        return f, (-div if track else None)

    def rk4_step(step, x, log_density):
        t0 = tf.cast(step, x.dtype) * dt
        k1, l1 = derivative(x, t0)
        k2, l2 = derivative(x + 0.5 * dt * k1, t0 + 0.5 * dt)
        k3, l3 = derivative(x + 0.5 * dt * k2, t0 + 0.5 * dt)
        k4, l4 = derivative(x + dt * k3, t0 + dt)
        x = x + dt / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        if track:
            log_density = log_density + dt / 6.0 * (l1 + 2.0 * l2 + 2.0 * l3 + l4)
        return step + 1, x, log_density

    if not track:
        _, x = tf.while_loop(
            lambda step, x: step < steps,
            lambda step, x: rk4_step(step, x, None)[:2],
            (tf.constant(0), x),
            maximum_iterations=int(steps),
        )
        return x, None
    _, x, log_density = tf.while_loop(
        lambda step, x, log_q: step < steps,
        rk4_step,
        (tf.constant(0), x, log_density),
        maximum_iterations=int(steps),
    )
    return x, log_density
