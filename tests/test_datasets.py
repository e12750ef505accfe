"""Data loaders: the offline scikit-learn sets, and tensorflow-datasets through tfds' mock data (no network)."""

import time

import numpy as np
import pytest

import bayes_keras as bk


def test_offline_sets():
    (x, y), (xt, yt) = bk.datasets.load_diabetes(seed=0)
    assert (
        x.shape == (353, 10) and xt.shape == (89, 10) and y.std() > 50
    )  # targets in their own units
    np.testing.assert_allclose(x.mean(0), 0.0, atol=1e-5)
    (x, y), (xt, yt) = bk.datasets.load_digits()
    assert x.shape[1:] == (8, 8, 1) and len(x) + len(xt) == 1797


@pytest.mark.parametrize(
    "load",
    [
        bk.datasets.load_digits,
        bk.datasets.load_digit_tokens,
        bk.datasets.load_breast_cancer,
        bk.datasets.load_diabetes,
    ],
)
def test_every_offline_loader_holds_out_a_test_set_by_default(load):
    (x, y), (xt, yt) = load()
    assert len(x) == len(y) > len(xt) == len(yt) > 0
    (x, _), (xt, _) = (
        load(test_fraction=0.0) if load is bk.datasets.load_breast_cancer else ((x, y), (xt, yt))
    )
    assert len(xt) == 0 or load is not bk.datasets.load_breast_cancer


def test_tfds_loader_with_mock_data(tmp_path, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(
        bk.datasets, "download_server_reachable", lambda timeout: True
    )  # mock_data downloads nothing
    with tfds.testing.mock_data(num_examples=12):
        (x, y), (xt, yt) = bk.datasets.load_tfds("mnist", data_dir=str(tmp_path))
    assert x.shape == (12, 28, 28, 1) and x.dtype == np.float32 and x.max() <= 1.0
    assert y.shape == (12,) and y.dtype == np.int32


def test_tfds_loader_fails_fast_without_data(tmp_path, monkeypatch):
    pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(
        bk.datasets, "download_server_reachable", lambda timeout: False
    )  # as offline
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match="not prepared .* cannot be reached"):
        bk.datasets.load_tfds("mnist", data_dir=str(tmp_path))
    assert time.perf_counter() - start < 30
    with pytest.raises(FileNotFoundError, match="download=False"):
        bk.datasets.load_tfds("mnist", data_dir=str(tmp_path), download=False)


def test_mroz_ships_with_the_package_and_matches_the_textbook():
    """bayes_keras/data/mroz.csv: 753 women, 428 in the labour force; in raw units the logit's maximum
    likelihood fit is Wooldridge's Example 17.1 (intercept 0.425, educ 0.221, kidslt6 -1.443)."""
    (x, y), (xt, yt) = bk.datasets.load_mroz(test_fraction=0.0, add_bias=True, standardize=False)
    assert x.shape == (753, 8) and len(xt) == 0 and y.sum() == 428 and set(np.unique(y)) == {0, 1}
    x, y = x.astype(np.float64), y.astype(np.float64)
    w = np.zeros(8)
    for _ in range(25):  # Newton's method for the logit MLE
        p = 1 / (1 + np.exp(-x @ w))
        w += np.linalg.solve((x * (p * (1 - p))[:, None]).T @ x, x.T @ (y - p))
    np.testing.assert_allclose(w[[7, 1, 5]], [0.4255, 0.2212, -1.4434], atol=6e-4)
    (x, y), (xt, yt) = bk.datasets.load_mroz()  # standardised with the training split's statistics
    assert x.shape == (564, 7) and xt.shape == (189, 7) and x.dtype == np.float32
    np.testing.assert_allclose(x.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(x.std(0), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="test_fraction"):
        bk.datasets.load_mroz(test_fraction=1.5)
