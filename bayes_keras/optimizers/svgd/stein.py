"""Stein variational gradient descent with matrix-valued kernels, as pure tensor functions (the scalar
kernel's direction, vanilla SVGD, is `svgd.svgd_direction`).

Notation (Wang, Tang, Bajaj & Liu, "Stein Variational Gradient Descent With Matrix-Valued Kernels",
NeurIPS 2019, https://arxiv.org/abs/1910.12794): particles x_1..x_N in R^D given as lists of (N, d_v)
tensors (one per flattened variable, never concatenated here); g_j = grad of the NEGATIVE log density
at x_j (what the model hands the optimizers), so grad log p(x_j) = -g_j. Every function returns the
DIRECTION TO SUBTRACT, -phi, as gpf_direction does (the optimizer steps x <- x - step(direction)).

Vanilla SVGD (Liu & Wang 2016):
    phi(x_i) = (1/N) sum_j [ k(x_j, x_i) grad log p(x_j) + grad_{x_j} k(x_j, x_i) ].

Matrix-valued kernels (Wang et al. 2019, their Algorithm 1; vanilla SVGD above is Liu & Wang's):
phi(x_i) = (1/N) sum_j [K(x_i, x_j) grad log p(x_j) + K(x_i, x_j) grad_{x_j}], with
(K grad)_l = sum_m d/dx_m K_lm.

"average" (Eqs. 12-15), K(x, x') = Q^{-1} k_Q(x, x') with the constant Q = Q_bar (the particles' average
curvature) and k_Q(x, x') = k(||x - x'||_Q^2) (for RBF exp(-||x - x'||_Q^2 / h), h = the median of
the squared Q-distances / log N). Since Q^{-1} grad_{x_j} exp(-||x_j - x_i||_Q^2 / h) = (2 / h) k (x_i - x_j):
    phi(x_i) = (1/N) sum_j k_Q(x_i, x_j) [ Q^{-1} grad log p(x_j) + (2 / h) (x_i - x_j) ]      [D]
(the paper's Eq. 13 writes exp(-||.||^2 / (2h)), whose constant is 1 / h: same kernel, h doubled).
This is vanilla SVGD on y = Q^{1/2} x mapped back (Lemma 2 / Theorem 3), which the tests check.

"mixture" (Eqs. 16-18), anchors z_l = the particles, Q_l = Q(z_l), weights
    w_l(x) = N(x; z_l, Q_l^{-1})^beta / sum_l' N(x; z_l', Q_l'^{-1})^beta   (log space, with log det Q_l)
and the kernel K(x, x') = N sum_l w_l(x) w_l(x') Q_l^{-1} k_{Q_l}(x, x') (we multiply the paper's kernel by
the number of anchors N, so that uniform weights (beta = 0) with equal Q_l give exactly "average").
Its Stein direction ([D], derived from Theorem 1 with the product rule on w_l(x')):
    phi_l(x_i) = (1/N) sum_j w_l(x_j) [ k_l(x_i, x_j) Q_l^{-1}(grad log p(x_j) + grad log w_l(x_j))
                                        + Q_l^{-1} grad_{x_j} k_l(x_j, x_i) ],
    grad log w_l(x) = beta [ -Q_l (x - z_l) + sum_l' w_l'(x) Q_l' (x - z_l') ],
    phi(x_i) = N sum_l w_l(x_i) phi_l(x_i).
Each anchor's bandwidth h_l is the median rule on squared Q_l-distances.

Markers: [D] a form derived here (and checked by tests/optimizers/test_matrix_svgd.py against its definition), [C]
the authors' public code (https://github.com/dilinwang820/matrix_svgd).

metric="euclidean" is the separable shortcut of the authors' code [C]: the scalar kernel uses the
Euclidean distance and the curvature only multiplies the result, K = k(x, x') Q_bar^{-1} ("average":
phi = Q_bar^{-1} phi_vanilla) or K = N sum_l w_l(x) w_l(x') k(x, x') Q_l^{-1} with isotropic weights
w_l(x) proportional to N(x; z_l, I)^beta ("mixture", as [C]). Both are valid matrix-valued kernels.

Kernels: bayes_keras.kernels; `kernel.evaluate(xs, ys=None, weights=None)` returns the Gram k (N, N)
(a radial kernel's bandwidth by default from the median of the squared distances, h = med / log N for RBF;
bayes_keras.kernels.RadialKernel) and the summed repulsion
sum_j grad_{x_j} k(x_j, x_i) (not divided by N), in x-coordinates when the kernel is evaluated on the
images ys = Q x (the Q^{-1} is applied inside), per anchor with `weights`.

Curvature operators: bayes_keras.preconditioners (Curvature.apply / solve / apply_mean / solve_mean /
log_det take lists aligned with the variables; None entries for variables outside a block).
"""

import tensorflow as tf

from bayes_keras.kernels.kernel import pairwise_sq_distances


def _n(particles):
    return tf.cast(tf.shape(particles[0])[0], particles[0].dtype)


def _select(values, block, size):
    """A list of length `size` with values[k] at position block[k] and None elsewhere."""
    out = [None] * size
    for k, v in enumerate(block):
        out[v] = values[k]
    return out


def matrix_svgd_average_direction(
    particles, grads, kernel, curvature, blocks, metric="q", rescale=None
):
    """Matrix-valued SVGD with the constant ("average") preconditioner Q_bar: -phi for every particle.

    Further arguments:

    - particles, grads, kernel, blocks: as `svgd_direction`.

    Args:
        curvature: a bayes_keras.preconditioners.Curvature (its mean Q_bar is used).
        metric: "q" (Eq. 13: kernel on Q_bar-distances) or "euclidean" (Q_bar^{-1} times vanilla SVGD).
        rescale: None, or a function (k, score, drift, curvature_drift) -> scalar called for the k-th block
            with the block's scores, its driving term Q_bar^{-1} K S / N and Q_bar times it (lists over the
            block's variables); the block's direction is multiplied by the scalar (MatrixSVGD's rescaling:
            `quadratic_model_scale` times a signal fraction).
    """
    size = len(particles)
    n = _n(particles)
    out = [None] * size
    for index, block in enumerate(blocks):
        xs = [particles[v] for v in block]
        ys = None
        if metric == "q":
            ys = [y for y in curvature.apply_mean(_select(xs, block, size)) if y is not None]
        k, rep = kernel.evaluate(xs, ys)
        products = [tf.matmul(k, -grads[v]) for v in block]  # K S
        driving = [p / n for p in products]
        # Q^{-1} on the drift only: the kernel's repulsion is already Q^{-1} grad k_Q
        if metric == "q":
            drift = curvature.solve_mean(_select(driving, block, size))
            drift = [drift[v] for v in block]
            phi = [d + r / n for d, r in zip(drift, rep)]
        else:  # separable kernel k Q^{-1}: precondition the whole vanilla direction
            pre = curvature.solve_mean(
                _select([(p + r) / n for p, r in zip(products, rep)], block, size)
            )
            phi = [pre[v] for v in block]
            if rescale is not None:
                drift = curvature.solve_mean(_select(driving, block, size))
                drift = [drift[v] for v in block]
        if rescale is not None:
            applied = curvature.apply_mean(_select(drift, block, size))
            scale = rescale(index, [-grads[v] for v in block], drift, [applied[v] for v in block])
            phi = [scale * p for p in phi]
        for v, p in zip(block, phi):
            out[v] = -p
    return out


def quadratic_model_scale(score, drift, curvature_drift):
    """alpha = sum_i <s_i, d_i> / sum_i <d_i, Q d_i>: the step along the driving term d that maximises the
    quadratic model  sum_i [log p(x_i) + a <s_i, d_i> - a^2 / 2 <d_i, Q d_i>]  of the log density (s_i its
    score at particle i, Q its curvature): KFAC's rescaling of a preconditioned step (Martens & Grosse
    2015, "Optimizing Neural Networks with Kronecker-factored Approximate Curvature", Sec. 6.4), applied to
    SVGD's driving term only, because the repulsive term is no gradient of the log density.

    With d = Q^{-1} (K S) / N (the average mode's drift; K the PSD kernel matrix) both sums are
    non-negative; a zero or non-finite denominator (no driving term at all) gives 1."""
    num = tf.add_n([tf.reduce_sum(s * d) for s, d in zip(score, drift)])
    den = tf.add_n([tf.reduce_sum(d * qd) for d, qd in zip(drift, curvature_drift)])
    usable = tf.logical_and(den > 0.0, tf.math.is_finite(den))
    return tf.where(usable, tf.maximum(num, 0.0) / tf.where(usable, den, 1.0), tf.ones_like(den))


def mixture_log_weights(particles, curvature, block=None, metric="q", beta=1.0):
    """Mixture weights in log space: returns (log_w, ys, d2) with log_w[l, j] = log w_l(x_j) (N anchors x N
    particles; softmax over l, every column sums to 1), ys the Q_l-images ys[v][l, j] = (Q_l x_j)_v (None
    for "euclidean") and d2 the pairwise squared distances in each anchor's metric (L, N, N) (or (N, N)).

    w_l(x) proportional to N(x; z_l, Q_l^{-1})^beta (metric "q") or N(x; z_l, I)^beta ("euclidean").
    """
    size = len(particles)
    block = list(range(size)) if block is None else list(block)
    xs = [particles[v] for v in block]
    n_int = int(xs[0].shape[0])
    if metric == "q":
        xb = [tf.broadcast_to(x[None], (n_int,) + tuple(x.shape)) for x in xs]
        ys = [
            y for y in curvature.apply(_select(xb, block, size)) if y is not None
        ]  # ys[l][j] = Q_l x_j
        d2 = pairwise_sq_distances(xs, ys)  # (L, N, N): ||x_i - x_j||^2_{Q_l}
        # [l, j] = d2[l, j, l] = ||x_j - z_l||^2_{Q_l} (d2 is symmetric in its last two axes)
        to_anchor = tf.transpose(tf.linalg.diag_part(tf.transpose(d2, (1, 0, 2))))
        logits = beta * (-0.5 * to_anchor + 0.5 * curvature.log_det(block)[:, None])
    else:
        ys, d2 = None, pairwise_sq_distances(xs)
        logits = beta * (-0.5 * d2)  # symmetric: [l, j] = ||x_j - z_l||^2
    return tf.nn.log_softmax(logits, axis=0), ys, d2


def matrix_svgd_mixture_direction(
    particles, grads, kernel, curvature, blocks, metric="q", beta=1.0
):
    """Matrix-valued SVGD with the anchor-mixture kernel (Eqs. 16-18), anchors = particles.

    Further arguments:

    - particles, grads, kernel, blocks: as `svgd_direction` (one mixture kernel per block).

    Args:
        curvature: a bayes_keras.preconditioners.Curvature (per-particle Q_l).
        metric: "q" (Eq. 16 with Eq. 13 components) or "euclidean" (the authors' separable shortcut).
        beta: exponent on the anchor densities in the weights (1: Eq. 17; 0: uniform weights).

    Returns:
        (directions, entropy): list of (N, d_v) tensors -phi, and the mean over particles and blocks
        of the weights' entropy H_j = -sum_l w_l(x_j) log w_l(x_j) (nats; log N = uniform,
        0 = one-hot: the collapse to per-particle Newton steps without repulsion).
    """
    size = len(particles)
    n = _n(particles)
    out = [None] * size
    entropies = []
    for block in blocks:
        xs = [particles[v] for v in block]
        glp = [-grads[v] for v in block]
        log_w, ys, d2 = mixture_log_weights(particles, curvature, block, metric, beta)
        w = tf.exp(log_w)  # (L, N): w[l, j] = w_l(x_j)
        entropies.append(tf.reduce_mean(-tf.reduce_sum(w * log_w, axis=0)))
        if metric == "q":
            # t[l, j] = Q_l (x_j - z_l) = y[l, j] - y[l, l]
            ts = [
                y - tf.transpose(tf.linalg.diag_part(tf.transpose(y, (2, 0, 1))))[:, None, :]
                for y in ys
            ]
            grad_log_w = [beta * (-t + tf.einsum("lj,ljd->jd", w, t)[None]) for t in ts]
            k, rep = kernel.evaluate(xs, ys, weights=w)  # k (L, N, N), rep[v] (L, N, d_v)
        else:
            # grad log w_l(x_j) = beta [z_l - sum_l' w_l'(x_j) z_l'] for unit-covariance anchors
            grad_log_w = [beta * (x[:, None, :] - tf.einsum("lj,ld->jd", w, x)[None]) for x in xs]
            k, rep = kernel.evaluate(xs, None, weights=w)  # k (N, N), rep[v] (L, N, d_v)
        kw = k * w[:, None, :]  # [l, i, j] = w_l(x_j) k_l(x_i, x_j)
        drift = [tf.einsum("lij,ljd->lid", kw, g[None] + gw) / n for g, gw in zip(glp, grad_log_w)]
        if metric == "q":
            pre = curvature.solve(_select(drift, block, size))
            phi_l = [pre[v] + r / n for v, r in zip(block, rep)]
        else:
            pre = curvature.solve(_select([d + r / n for d, r in zip(drift, rep)], block, size))
            phi_l = [pre[v] for v in block]
        for v, p in zip(block, phi_l):
            out[v] = -n * tf.einsum("li,lid->id", w, p)
    return out, tf.add_n(entropies) / float(len(entropies))
