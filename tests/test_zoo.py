"""Every optimizer trains every zoo model a few steps through fit (finite, decreasing loss). ResNet-20 and
text_rnn have their own files (test_resnet.py, test_text_rnn.py); here LeNet-5, the MLP and the GRU
classifier."""

import keras
import numpy as np
import pytest

import bayes_keras as bk

OPTIMIZERS = {
    "GaussianParticleFlow": lambda: bk.optimizers.GaussianParticleFlow(),
    "IndependentParticles": lambda: bk.optimizers.IndependentParticles(),
    "SVGD": lambda: bk.optimizers.SVGD(),
    "MatrixSVGD": lambda: bk.optimizers.MatrixSVGD(),
    "PreconditionedParticles": lambda: bk.optimizers.PreconditionedParticles(),
    "MeanFieldVI": lambda: bk.optimizers.MeanFieldVI(),
    "MGVBP": lambda: bk.optimizers.MGVBP(),
}
MODELS = {
    "lenet5": lambda: bk.zoo.lenet5(num_particles=3),
    "mlp": lambda: bk.zoo.mlp(64, 10, (32,), num_particles=3, likelihood="categorical"),
    "gru_classifier": lambda: bk.zoo.gru_classifier(3, units=16),
}


@pytest.fixture(scope="module")
def digits():
    (x, y), _ = bk.datasets.load_digits()
    return x[:256], y[:256]


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_optimizer_trains_every_zoo_model(model, optimizer, digits):
    x, y = digits
    if model == "mlp":
        x = x.reshape(len(x), -1)
    keras.utils.set_random_seed(0)
    net = MODELS[model]()
    net.compile(optimizer=OPTIMIZERS[optimizer]())
    losses = net.fit(x, y, epochs=4, batch_size=64, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
