"""MatrixSVGD + KFAC on a recurrent classifier through model.fit (issue #3: the GRU experiment).

tests/curvature/test_kfac.py checks the recurrent factors against an explicit time loop with a recording optimizer,
and MatrixSVGD + KFAC through fit on an MLP; here the whole path of the GRU experiment
(bk.zoo.gru_classifier, reset_after=True, categorical likelihood, digit rows as time steps) runs through
model.fit with the preconditioner's own running state: exact input factor after the first step (time steps
as locations), symmetric PSD running factors with the homogeneous coordinate kept at 1, damped inverses
that invert, finite particles and no skipped step, in both modes.
"""

import numpy as np
import pytest

import bayes_keras as bk

N, UNITS, B = 3, 4, 32


def _digits(count):
    (x, y), _ = bk.datasets.load_digits(image=True)
    return x[:count], y[:count]


def _np(v):
    return np.asarray(v.numpy() if hasattr(v, "numpy") else v, dtype=np.float64)


@pytest.mark.parametrize("mode", ["average", "mixture"])
def test_matrix_svgd_kfac_trains_a_gru_classifier_through_fit(mode):
    x, y = _digits(4 * B)
    model = bk.zoo.gru_classifier(N, units=UNITS)  # (8, 8, 1) images -> 8 time steps of 8 pixels
    pre = bk.preconditioners.KFACPreconditioner(inversion_period=2)
    opt = bk.optimizers.MatrixSVGD(0.05, pre, mode=mode)
    model.compile(optimizer=opt)
    before = model.evaluate(x, y, verbose=0, return_dict=True)["nll"]

    # One step on the first batch: EMA rho_1 = 0, so the running input factor of the GRU is exactly this
    # batch's mean over the B * T (example, time step) rows of [x_t; 1][x_t; 1]^T, the same for every particle
    # (the first layer reads the shared input).
    model.fit(x[:B], y[:B], batch_size=B, epochs=1, verbose=0, shuffle=False, dataset_size=len(x))
    rows = np.concatenate([x[:B].reshape(B * 8, 8), np.ones((B * 8, 1), np.float32)], 1).astype(
        np.float64
    )
    gru_factors, out_factors = pre.factor_variables
    a_in = _np(gru_factors["A_in"])
    for p in range(N):
        np.testing.assert_allclose(a_in[p], rows.T @ rows / (B * 8), rtol=1e-5, atol=1e-6)

    model.fit(x, y, batch_size=B, epochs=3, verbose=0)
    steps = 1 + 3 * 4
    assert int(pre.updates) == steps
    assert int(opt.skipped_curvature_steps) == 0 and model.skipped_steps == 0
    assert all(np.all(np.isfinite(_np(v))) for v in model.particle_variables)
    assert model.evaluate(x, y, verbose=0, return_dict=True)["nll"] < before

    width = 3 * UNITS  # z, r, h blocks
    expected = {
        "A_in": 8 + 1,
        "G": width,
        "A_rec": UNITS + 1,
        "G_rec": width,
    }  # reset_after: [U; b_rec]
    assert {k: tuple(v.shape) for k, v in gru_factors.items()} == {
        k: (N, d, d) for k, d in expected.items()
    }
    assert {k: tuple(v.shape) for k, v in out_factors.items()} == {
        "A": (N, UNITS + 1, UNITS + 1),
        "G": (N, 10, 10),
    }
    for factors in (gru_factors, out_factors):
        for name, variable in factors.items():
            f = _np(variable)
            np.testing.assert_allclose(f, np.swapaxes(f, 1, 2), atol=1e-5 * np.abs(f).max())
            eigenvalues = np.linalg.eigvalsh(0.5 * (f + np.swapaxes(f, 1, 2)))
            assert eigenvalues.min() >= -1e-5 * eigenvalues.max(), name
            if name.startswith("A"):  # homogeneous coordinate: an EMA of batch means of 1 * 1
                np.testing.assert_allclose(f[:, -1, -1], 1.0, rtol=1e-5)

    # the last inversion's damped factors and inverses: per particle (the mixture's) and of the mean (average)
    for layer in range(2):
        for role, b in pre.block_variables(layer).items():
            for factor, inverse in (("a", "a_inv"), ("g", "g_inv")):
                m, inv = _np(b[factor]), _np(b[inverse])
                eye = np.broadcast_to(np.eye(m.shape[-1]), m.shape)
                np.testing.assert_allclose(m @ inv, eye, atol=1e-3, err_msg=f"{role}/{factor}")
                mm, minv = _np(b[factor + "_mean"]), _np(b[factor + "_mean_inv"])
                np.testing.assert_allclose(
                    mm @ minv, np.eye(mm.shape[-1]), atol=1e-3, err_msg=f"{role}/{factor} mean"
                )

    entropy = float(opt.mixture_weight_entropy)
    if mode == "mixture":
        assert 0.0 <= entropy <= np.log(N) + 1e-5
    else:
        assert entropy == 0.0
