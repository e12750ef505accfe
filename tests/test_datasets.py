"""Data loaders: the offline scikit-learn sets, and tensorflow-datasets through tfds' mock data (no network)."""

import time

import numpy as np
import pytest

import bayes_keras as bk


def test_offline_sets():
    (x, y), (xt, yt) = bk.datasets.load_diabetes(seed=0)
    assert x.shape == (353, 10) and xt.shape == (89, 10) and y.std() > 50  # targets in their own units
    np.testing.assert_allclose(x.mean(0), 0.0, atol=1e-5)
    (x, y), (xt, yt) = bk.datasets.load_digits()
    assert x.shape[1:] == (8, 8, 1) and len(x) + len(xt) == 1797


@pytest.mark.parametrize("load", [bk.datasets.load_digits, bk.datasets.load_digit_tokens,
                                  bk.datasets.load_breast_cancer, bk.datasets.load_diabetes])
def test_every_offline_loader_holds_out_a_test_set_by_default(load):
    (x, y), (xt, yt) = load()
    assert len(x) == len(y) > len(xt) == len(yt) > 0
    (x, _), (xt, _) = load(test_fraction=0.0) if load is bk.datasets.load_breast_cancer else ((x, y), (xt, yt))
    assert len(xt) == 0 or load is not bk.datasets.load_breast_cancer


def test_tfds_loader_with_mock_data(tmp_path, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(bk.datasets, "download_server_reachable", lambda timeout: True)  # mock_data downloads nothing
    with tfds.testing.mock_data(num_examples=12):
        (x, y), (xt, yt) = bk.datasets.load_tfds("mnist", data_dir=str(tmp_path))
    assert x.shape == (12, 28, 28, 1) and x.dtype == np.float32 and x.max() <= 1.0
    assert y.shape == (12,) and y.dtype == np.int32


def test_tfds_loader_fails_fast_without_data(tmp_path, monkeypatch):
    pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(bk.datasets, "download_server_reachable", lambda timeout: False)  # as offline
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match="not prepared .* cannot be reached"):
        bk.datasets.load_tfds("mnist", data_dir=str(tmp_path))
    assert time.perf_counter() - start < 30
    with pytest.raises(FileNotFoundError, match="download=False"):
        bk.datasets.load_tfds("mnist", data_dir=str(tmp_path), download=False)
