"""conversion_report: which weights of a BayesianModel carry particles, layer by layer."""

from typing import NamedTuple

import keras
import numpy as np

# keras.src: no public name for a graph (functional) model; Sequential is not one
from keras.src.models.functional import Functional

from bayes_keras.layers.base import ParticleLayer
from bayes_keras.layers.converted import Batchless, Converted

BAYESIAN = "bayesian"  # its weights carry the particle axis (a posterior over them)
# after the particle axis, one weight set shared by every particle (a point estimate)
SHARED = "shared"
BEFORE_AXIS = "keras"  # before the particle axis: a Keras layer that runs once per example


class LayerRow(NamedTuple):
    """One layer of a `ConversionReport`."""

    name: str
    kind: str  # the layer's class name
    role: str  # "bayesian", "shared" or "keras" (before the particle axis)
    trainable: bool
    # weights of one network (one particle), statistics such as moving averages included
    parameters: int
    stored: int  # entries held in memory: parameters x N for particle weights


class ConversionReport:
    """Per layer with weights: Bayesian (particles), shared (one point estimate after the particle axis) or Keras
    (before the particle axis, run once per example); its parameters; and the fraction of one network's
    weights that carry particles. `print(report)` shows it as a table; `rows` holds `LayerRow`s."""

    def __init__(self, model_name, num_particles, rows):
        self.model_name, self.num_particles, self.rows = model_name, num_particles, list(rows)

    def _total(self, role=None):
        return sum(r.parameters for r in self.rows if role is None or r.role == role)

    @property
    def bayesian_fraction(self):
        """The fraction of one network's weights that carry particles (0 to 1)."""
        total = self._total()
        return self._total(BAYESIAN) / total if total else 0.0

    @property
    def shared_layers(self):
        """Names of the layers after the particle axis whose weights all particles share."""
        return [r.name for r in self.rows if r.role == SHARED]

    def summary(self):
        """One line: how many weights carry particles, are shared, or run before the particle axis."""
        parts = [
            f"{self._total(role):,} {label}"
            for role, label in (
                (BAYESIAN, "Bayesian"),
                (SHARED, "shared"),
                (BEFORE_AXIS, "before the particle axis"),
            )
        ]
        return (
            f"{self.model_name}: {self.bayesian_fraction:.1%} of the weights carry {self.num_particles} "
            f"particles (parameters per network: {', '.join(parts)})"
        )

    def __str__(self):
        header = ("layer", "type", "role", "trainable", "parameters", "stored")
        body = [
            (
                r.name,
                r.kind,
                r.role,
                "yes" if r.trainable else "frozen",
                f"{r.parameters:,}",
                f"{r.stored:,}",
            )
            for r in self.rows
        ]
        widths = [max(len(str(cell)) for cell in column) for column in zip(header, *body)]
        lines = [
            "  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip()
            for line in [header] + body
        ]
        return "\n".join([self.summary()] + lines)

    __repr__ = __str__


def conversion_report(model):
    """A `ConversionReport` of a functional or Sequential BayesianModel (e.g. one `bayesianize` returned): for
    every layer with weights, whether they carry particles ("bayesian"), are one copy shared by all particles
    after the particle axis ("shared"), or belong to a Keras layer before it ("keras", run once per example);
    whether they train; their parameters; and the fraction of the weights that carry particles.

    Example:
        >>> model = bayes_keras.bayesianize(keras_model, num_particles=8, bayesian=["head"])
        >>> print(bayes_keras.conversion_report(model))
        >>> bayes_keras.conversion_report(model).bayesian_fraction
    """
    operations = getattr(model, "operations", None)
    if not isinstance(model, Functional) or operations is None:
        raise ValueError(
            "conversion_report reads the layer graph of a functional or Sequential BayesianModel; got "
            f"{type(model).__name__}."
        )
    n = model.num_particles
    carrying = set()  # ids of the graph's tensors that carry the particle axis
    rows = []
    for operation in operations:
        if isinstance(operation, keras.layers.InputLayer):
            continue
        inputs = _tensors(operation, "input")
        after_axis = isinstance(operation, ParticleLayer) or any(id(t) in carrying for t in inputs)
        # a custom layer's
        starts = any(_is_particle(v) for layer in _with_nested(operation) for v in layer.weights)
        # twins can start the axis (the keras.io token and position embedding)
        if after_axis or starts:
            carrying.update(id(t) for t in _tensors(operation, "output"))
        for layer in _with_nested(operation):
            if not layer.weights:
                continue
            if not isinstance(layer, ParticleLayer) and any(_is_particle(v) for v in layer.weights):
                rows.extend(_composite_rows(layer))  # attention, Bidirectional: per sublayer
            else:
                rows.append(_row(layer, after_axis, n))
    return ConversionReport(model.name, n, rows)


def _tensors(operation, attribute):
    try:
        return keras.tree.flatten(getattr(operation, attribute))
    except (AttributeError, ValueError):
        return []


def _with_nested(layer):
    """`layer`, or the layers of a nested Sequential / functional model in its place."""
    if isinstance(layer, (Functional, keras.Sequential)):
        for inner in layer.layers:
            yield from _with_nested(inner)
    elif isinstance(layer, keras.layers.Layer) and not isinstance(layer, keras.layers.InputLayer):
        yield layer  # (keras.ops operations hold no weights)


def _row(layer, after_axis, num_particles):
    particle = {id(v) for v in getattr(layer, "particle_variables", [])}
    stored = sum(int(np.prod(v.shape)) for v in layer.weights)
    if isinstance(layer, ParticleLayer):
        # per-particle statistics (moving averages) have the particle axis too, without being particle weights
        per_network = sum(
            int(np.prod(v.shape[1:]))
            if (id(v) in particle or _per_particle(v, layer, num_particles))
            else int(np.prod(v.shape))
            for v in layer.weights
        )
        role = SHARED if layer.deterministic else BAYESIAN
    else:
        per_network = stored
        role = SHARED if after_axis else BEFORE_AXIS
    return LayerRow(
        layer.name, type(layer).__name__, role, bool(layer.trainable), per_network, stored
    )


def _is_particle(variable):
    return bool(getattr(variable, "is_particle_variable", False))


def _composite_rows(layer):
    """A layer made of particle sublayers (MultiHeadAttention's projections, Bidirectional's directions, a
    converted custom layer's twins): one row per sublayer, named by its path ("attention/query", "block/att/key")."""
    groups = {}
    for v in layer.weights:
        groups.setdefault(_sublayer_path(layer, v), []).append(v)
    rows = []
    for path, variables in groups.items():
        particle = any(_is_particle(v) for v in variables)
        per_network = sum(
            int(np.prod(v.shape[1:] if _is_particle(v) else v.shape)) for v in variables
        )
        # frozen parts of a layer that carries particles (LoRA's)
        role = BAYESIAN if particle else SHARED
        # the user's class
        kind = type(layer.layer if isinstance(layer, Converted) else layer).__name__
        rows.append(
            LayerRow(
                path,
                kind,
                role,
                any(v.trainable for v in variables),
                per_network,
                sum(int(np.prod(v.shape)) for v in variables),
            )
        )
    return rows


def _sublayer_path(layer, variable):
    """The path of the sublayer holding `variable`: its variable path without the variable's name, or for a converted
    custom layer, the layer's name, the twin's attribute path and the projection inside it ("block/att/query")."""
    parts = variable.path.split("/")
    for attribute, twin in getattr(layer, "twins", {}).items():
        inner = twin.layer if isinstance(twin, Batchless) else twin
        if any(variable is w for w in inner.weights):
            after = (
                parts[len(parts) - 1 - parts[::-1].index(inner.name) : -1]
                if inner.name in parts
                else []
            )
            return "/".join([layer.name, attribute] + after[1:])
    return "/".join(parts[:-1])


def _per_particle(variable, layer, num_particles):
    return (
        not variable.trainable
        and len(variable.shape) > 0
        and variable.shape[0] == num_particles
        and all(id(variable) != id(v) for v, _, _ in layer.prior_terms)
    )
