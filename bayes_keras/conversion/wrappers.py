"""scikit-learn estimators around a BayesianModel: pipelines, grid search and cross-validation.

`keras.wrappers.SKLearnClassifier` / `SKLearnRegressor` expect a Keras loss and one-hot labels; a BayesianModel
trains on a likelihood and integer class labels. These subclasses keep Keras' interface (`model=` a compiled
BayesianModel, cloned without its weights for every fit, or a callable `model(X, y, **model_kwargs)` that
builds one; `fit_kwargs`; `warm_start`) and pass the labels as class indices. The classifier's
`predict_proba` is the posterior predictive.
"""

import keras
import numpy as np
from sklearn.preprocessing import LabelEncoder

from bayes_keras.model import BayesianModel


def _check_model(model):
    if not isinstance(model, BayesianModel):
        raise ValueError(
            f"bayes_keras.wrappers estimators wrap a BayesianModel; got {type(model).__name__}. "
            "For a plain Keras model use keras.wrappers."
        )
    if not getattr(model, "compiled", False) or model.optimizer is None or model.likelihood is None:
        raise ValueError(
            f"The BayesianModel '{model.name}' must be compiled with an optimizer and have a likelihood "
            "(model.compile(optimizer=bayes_keras.optimizers.GaussianParticleFlow()) with "
            "likelihood= on the model or in compile)."
        )


class _BayesianEstimator:
    """What the classifier and the regressor share: fit without Keras' loss check, and cloning that keeps
    fit_kwargs (Keras' __sklearn_clone__ drops them) and clones the model through keras.models.clone_model."""

    def fit(self, X, y, **kwargs):
        X, y = self._validated(X, y)
        model = (
            self.model_ if self.warm_start and hasattr(self, "model_") else self._get_model(X, y)
        )
        _check_model(model)
        self.history_ = model.fit(
            X, self._process_target(y, reset=True), **{**(self.fit_kwargs or {}), **kwargs}
        )
        self.model_ = model
        return self

    def _validated(self, X, y):
        X = np.asarray(X)
        if X.dtype == object or not np.issubdtype(X.dtype, np.number):
            raise ValueError(f"{type(self).__name__}.fit expects numeric X; got dtype {X.dtype}.")
        y = np.asarray(y)
        if len(X) != len(y):
            raise ValueError(f"{type(self).__name__}.fit: X has {len(X)} rows and y {len(y)}.")
        self.n_features_in_ = X.shape[1] if X.ndim > 1 else 1
        return X.astype(np.float32), y

    def __sklearn_clone__(self):
        return type(self)(
            model=self.model,
            warm_start=self.warm_start,
            model_kwargs=self.model_kwargs,
            fit_kwargs=self.fit_kwargs,
        )

    def _get_model(self, X, y):
        if isinstance(self.model, keras.Model):
            # the architecture, compiled, without the weights
            return keras.models.clone_model(self.model)
        return self.model(X=X, y=y, **(self.model_kwargs or {}))


class SKLearnClassifier(_BayesianEstimator, keras.wrappers.SKLearnClassifier):
    """A scikit-learn classifier around a BayesianModel with a categorical or Bernoulli likelihood.

    Labels may be any values scikit-learn accepts (strings, integers); the model trains on their class indices.
    `predict` returns the class of highest posterior predictive probability, `predict_proba` the probabilities.

    Example:
        >>> clf = bayes_keras.wrappers.SKLearnClassifier(model, fit_kwargs={"epochs": 20, "verbose": 0})
        >>> sklearn.model_selection.cross_val_score(clf, x, y, cv=3)
    """

    def _process_target(self, y, reset=False):
        if reset:
            self._encoder = LabelEncoder().fit(np.ravel(y))
            self.classes_ = self._encoder.classes_
            if len(self.classes_) < 2:
                raise ValueError("SKLearnClassifier needs at least two classes in y; got one.")
        return self._encoder.transform(np.ravel(y)).astype(np.int32)

    def predict_proba(self, X):
        """Posterior predictive class probabilities, (n, classes)."""
        probabilities = np.asarray(self.model_.predict(np.asarray(X, np.float32), verbose=0))
        if probabilities.ndim == 1:  # Bernoulli: the probability of class 1
            probabilities = np.stack([1.0 - probabilities, probabilities], axis=1)
        return probabilities

    def predict(self, X):
        return self.classes_[np.argmax(self.predict_proba(X), axis=1)]


class SKLearnRegressor(_BayesianEstimator, keras.wrappers.SKLearnRegressor):
    """A scikit-learn regressor around a BayesianModel with a Normal likelihood; `predict` returns the posterior
    predictive mean.

    Example:
        >>> reg = bayes_keras.wrappers.SKLearnRegressor(model, fit_kwargs={"epochs": 50, "verbose": 0})
        >>> sklearn.model_selection.cross_val_score(reg, x, y, cv=3)
    """

    def _process_target(self, y, reset=False):
        y = np.asarray(y, np.float32)
        if reset:
            self._one_column = y.ndim == 1
        return y

    def predict(self, X):
        summary = self.model_.predict(np.asarray(X, np.float32), verbose=0)
        mean = np.asarray(summary["mean"] if isinstance(summary, dict) else summary)
        return mean[:, 0] if self._one_column and mean.ndim == 2 and mean.shape[1] == 1 else mean
