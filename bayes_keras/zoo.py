"""Model zoo: standard architectures as BayesianModels (and their deterministic Keras twins)."""

import numbers

import keras

from bayes_keras import layers
from bayes_keras.model import BayesianModel


def lenet5(
    input_shape=(8, 8, 1), num_classes=10, num_particles=10, deterministic_layers=(), **model_kwargs
):
    """LeNet-5 with a particle axis: conv(6,5)-pool-conv(16,5)-pool-dense(120)-dense(84)-dense(classes).

    'same' padding keeps it valid for small inputs such as 8x8 digits (the original used 'valid'
    on 32x32). `deterministic_layers` names layers ("conv1", "conv2", "fc1", "fc2", "out") whose
    weights are shared by all particles (a hybrid network).

    Example:
        >>> model = bayes_keras.zoo.lenet5((8, 8, 1), 10, num_particles=10, likelihood="categorical")
    """
    det = set(deterministic_layers)
    unknown = det - {"conv1", "conv2", "fc1", "fc2", "out"}
    if unknown:
        raise ValueError(
            f"Unknown LeNet-5 layer names {sorted(unknown)}; use conv1, conv2, fc1, fc2, out."
        )
    model_kwargs.setdefault("likelihood", "categorical")
    inputs = keras.Input(input_shape)
    h = layers.Conv2D(
        6,
        5,
        padding="same",
        activation="relu",
        num_particles=num_particles,
        deterministic="conv1" in det,
        name="conv1",
    )(inputs)
    h = layers.MaxPooling2D(2, name="pool1")(h)
    h = layers.Conv2D(
        16, 5, padding="same", activation="relu", deterministic="conv2" in det, name="conv2"
    )(h)
    h = layers.MaxPooling2D(2, name="pool2")(h)
    h = layers.Flatten(name="flatten")(h)
    h = layers.Dense(120, activation="relu", deterministic="fc1" in det, name="fc1")(h)
    h = layers.Dense(84, activation="relu", deterministic="fc2" in det, name="fc2")(h)
    outputs = layers.Dense(num_classes, deterministic="out" in det, name="out")(h)
    return BayesianModel(inputs, outputs, name="bayesian_lenet5", **model_kwargs)


def keras_lenet5(input_shape=(8, 8, 1), num_classes=10):
    """The same LeNet-5 from plain Keras layers (the deterministic baseline; logits out)."""
    return keras.Sequential(
        [
            keras.Input(input_shape),
            keras.layers.Conv2D(6, 5, padding="same", activation="relu", name="conv1"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(16, 5, padding="same", activation="relu", name="conv2"),
            keras.layers.MaxPooling2D(2),
            keras.layers.Flatten(),
            keras.layers.Dense(120, activation="relu", name="fc1"),
            keras.layers.Dense(84, activation="relu", name="fc2"),
            keras.layers.Dense(num_classes, name="out"),
        ],
        name="lenet5",
    )


def gru_classifier(
    num_particles=10,
    units=32,
    num_classes=10,
    input_shape=(8, 8, 1),
    deterministic_layers=(),
    **model_kwargs,
):
    """GRU classifier read row by row: image rows are time steps (digits: 8 steps of 8 pixels).

    input (batch, *input_shape) -> reshaped to (batch, input_shape[0], prod(rest)) -> GRU(units)
    -> Dense(num_classes) logits, (batch, N, num_classes). The default input is the (8, 8, 1)
    images of `bayes_keras.datasets.load_digits()`; a (T, F) input_shape takes sequences as is.
    `deterministic_layers` names layers ("gru", "out") whose weights are shared by all particles.

    Example:
        >>> model = bayes_keras.zoo.gru_classifier(10, units=32, num_classes=10)
    """
    det = set(deterministic_layers)
    unknown = det - {"gru", "out"}
    if unknown:
        raise ValueError(f"Unknown GRU classifier layer names {sorted(unknown)}; use gru, out.")
    input_shape = tuple(input_shape)
    if len(input_shape) < 2:
        raise ValueError(
            f"gru_classifier needs input_shape (time, features, ...); got {input_shape}."
        )
    model_kwargs.setdefault("likelihood", "categorical")
    inputs = keras.Input(input_shape)
    h = inputs
    if len(input_shape) > 2:
        features = 1
        for d in input_shape[1:]:
            features *= d
        h = keras.layers.Reshape((input_shape[0], features), name="rows")(h)
    h = layers.GRU(units, num_particles=num_particles, deterministic="gru" in det, name="gru")(h)
    outputs = layers.Dense(num_classes, deterministic="out" in det, name="out")(h)
    return BayesianModel(inputs, outputs, name="bayesian_gru_classifier", **model_kwargs)


TEXT_RNN_LAYERS = ("embedding", "rnn", "out")


def text_rnn(
    vocabulary_size,
    num_outputs,
    embedding_dim=32,
    units=32,
    cell="gru",
    num_particles=10,
    mask_zero=True,
    dropout=0.0,
    recurrent_dropout=0.0,
    deterministic_layers=(),
    **model_kwargs,
):
    """Token sequences -> Embedding -> GRU or LSTM -> Dense: a text classifier (default likelihood
    "categorical", `num_outputs` classes) or, with `likelihood="normal"`, a regressor.

    Input (batch, T) integer ids in 1..vocabulary_size; with `mask_zero=True` (default) id 0 is padding:
    the table has vocabulary_size + 1 rows and the recurrent layer skips padded steps, so left- and
    right-padded sequences give the same output. `deterministic_layers` names layers ("embedding",
    "rnn", "out") whose weights all particles share (a hybrid network).

    Example:
        >>> (x, y), _ = bayes_keras.datasets.load_digit_tokens()
        >>> model = bayes_keras.zoo.text_rnn(bayes_keras.datasets.DIGIT_TOKENS, 10, cell="gru", num_particles=8)
    """
    det = set(deterministic_layers)
    unknown = det - set(TEXT_RNN_LAYERS)
    if unknown:
        raise ValueError(
            f"Unknown text_rnn layer names {sorted(unknown)}; use {', '.join(TEXT_RNN_LAYERS)}."
        )
    cells = {"gru": layers.GRU, "lstm": layers.LSTM}
    if cell not in cells:
        raise ValueError(f"text_rnn cell must be one of {sorted(cells)}; got {cell!r}.")
    if (
        isinstance(vocabulary_size, bool)
        or not isinstance(vocabulary_size, numbers.Integral)
        or vocabulary_size < 1
    ):
        raise ValueError(
            f"text_rnn vocabulary_size must be a positive integer; got {vocabulary_size!r}."
        )
    model_kwargs.setdefault("likelihood", "categorical")
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    h = layers.Embedding(
        int(vocabulary_size) + int(mask_zero),
        embedding_dim,
        mask_zero=mask_zero,
        num_particles=num_particles,
        deterministic="embedding" in det,
        name="embedding",
    )(tokens)
    h = cells[cell](
        units,
        dropout=dropout,
        recurrent_dropout=recurrent_dropout,
        deterministic="rnn" in det,
        name="rnn",
    )(h)
    outputs = layers.Dense(num_outputs, deterministic="out" in det, name="out")(h)
    return BayesianModel(tokens, outputs, name=f"bayesian_text_{cell}", **model_kwargs)


def keras_text_rnn(
    vocabulary_size,
    num_outputs,
    embedding_dim=32,
    units=32,
    cell="gru",
    mask_zero=True,
    dropout=0.0,
    recurrent_dropout=0.0,
):
    """The same text model from plain Keras layers (logits or means out)."""
    rnn = {"gru": keras.layers.GRU, "lstm": keras.layers.LSTM}[cell]
    return keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            keras.layers.Embedding(
                vocabulary_size + int(mask_zero),
                embedding_dim,
                mask_zero=mask_zero,
                name="embedding",
            ),
            rnn(units, dropout=dropout, recurrent_dropout=recurrent_dropout, name="rnn"),
            keras.layers.Dense(num_outputs, name="out"),
        ],
        name=f"text_{cell}",
    )


def mlp(
    input_dim, output_dim, hidden=(50, 50), activation="relu", num_particles=10, **model_kwargs
):
    """Fully connected BayesianModel: input_dim -> hidden... -> output_dim (logits or means).

    Example:
        >>> model = bayes_keras.zoo.mlp(10, 1, (50, 50), num_particles=10, likelihood="normal")
    """
    if isinstance(input_dim, bool) or not isinstance(input_dim, int) or input_dim < 1:
        raise ValueError(f"mlp input_dim must be a positive integer; got {input_dim!r}.")
    if isinstance(hidden, int) or not all(
        isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in hidden
    ):
        raise ValueError(
            f"mlp hidden must be a sequence of layer widths, e.g. (50, 50) or (50,); got {hidden!r}."
        )
    inputs = keras.Input((input_dim,))
    h = inputs
    for i, width in enumerate(hidden):
        h = layers.Dense(
            width,
            activation=activation,
            num_particles=num_particles if i == 0 else None,
            name=f"dense_{i}",
        )(h)
    outputs = layers.Dense(output_dim, num_particles=None if hidden else num_particles, name="out")(
        h
    )
    return BayesianModel(inputs, outputs, name="bayesian_mlp", **model_kwargs)


def keras_mlp(input_dim, output_dim, hidden=(50, 50), activation="relu"):
    """The same MLP from plain Keras layers."""
    return keras.Sequential(
        [keras.Input((input_dim,))]
        + [keras.layers.Dense(w, activation=activation) for w in hidden]
        + [keras.layers.Dense(output_dim)],
        name="mlp",
    )


RESNET20_PARTS = ("stem", "stage1", "stage2", "stage3", "head")


def _resnet20_graph(inputs, num_classes, conv, batch_norm, dense, pooling, deterministic=()):
    """ResNet-20 v1 for CIFAR-sized inputs (He et al. 2016, https://arxiv.org/abs/1512.03385, Sec. 4.2):
    a 3x3 conv (16), then 3 stages of 3 residual blocks (16, 32, 64 filters; stride 2 entering stages 2 and 3,
    with a 1x1 projection shortcut there, option B), global average pooling and a dense head. Built from
    the given layer constructors, so the particle and the Keras versions share one definition."""

    def part_of(name):
        return {"deterministic": name in deterministic} if deterministic is not None else {}

    h = conv(16, 3, padding="same", name="stem_conv", first=True, **part_of("stem"))(inputs)
    h = batch_norm(name="stem_bn", **part_of("stem"))(h)
    h = keras.layers.Activation("relu", name="stem_relu")(h)
    for stage, filters in enumerate((16, 32, 64), start=1):
        for block in range(3):
            strides = 2 if stage > 1 and block == 0 else 1
            prefix, flags = f"stage{stage}_block{block}", part_of(f"stage{stage}")
            y = conv(filters, 3, strides=strides, padding="same", name=f"{prefix}_conv1", **flags)(
                h
            )
            y = batch_norm(name=f"{prefix}_bn1", **flags)(y)
            y = keras.layers.Activation("relu", name=f"{prefix}_relu1")(y)
            y = conv(filters, 3, padding="same", name=f"{prefix}_conv2", **flags)(y)
            y = batch_norm(name=f"{prefix}_bn2", **flags)(y)
            shortcut = (
                h
                if strides == 1
                else conv(filters, 1, strides=strides, name=f"{prefix}_projection", **flags)(h)
            )
            h = keras.layers.Activation("relu", name=f"{prefix}_out")(
                keras.layers.Add(name=f"{prefix}_add")([y, shortcut])
            )
    h = pooling(name="pool")(h)
    return dense(num_classes, name="head", **part_of("head"))(h)


def resnet20(
    input_shape=(32, 32, 3), num_classes=10, num_particles=4, deterministic_parts=(), **model_kwargs
):
    """ResNet-20 v1 (CIFAR variant, ~0.27M weights per particle) with a particle axis and particle
    BatchNormalization (per-particle batch statistics): N ResNet-20s in one pass.

    `deterministic_parts` names parts whose weights all particles share (a hybrid network): any of "stem",
    "stage1", "stage2", "stage3", "head" (e.g. ("stem", "stage1", "stage2") keeps only the last stage and
    the head Bayesian). Every optimizer trains it; the KFAC-based ones and MGVBP's Fisher curvatures give
    BatchNormalization's scale and offset diagonal Fisher blocks (bayes_keras/curvature/kfac/batch_normalization.py).

    Example:
        >>> model = bayes_keras.zoo.resnet20((32, 32, 3), 10, num_particles=4, deterministic_parts=("stem",))
    """
    unknown = set(deterministic_parts) - set(RESNET20_PARTS)
    if unknown:
        raise ValueError(
            f"Unknown ResNet-20 parts {sorted(unknown)}; use {', '.join(RESNET20_PARTS)}."
        )
    model_kwargs.setdefault("likelihood", "categorical")

    def conv(filters, size, first=False, **kwargs):
        return layers.Conv2D(
            filters,
            size,
            num_particles=num_particles if first else None,
            use_bias=False,
            kernel_initializer="he_normal",
            **kwargs,
        )

    inputs = keras.Input(input_shape)
    outputs = _resnet20_graph(
        inputs,
        num_classes,
        conv,
        layers.BatchNormalization,
        layers.Dense,
        layers.GlobalAveragePooling2D,
        tuple(deterministic_parts),
    )
    return BayesianModel(inputs, outputs, name="bayesian_resnet20", **model_kwargs)


def keras_resnet20(input_shape=(32, 32, 3), num_classes=10):
    """The same ResNet-20 from plain Keras layers (logits out)."""

    def conv(filters, size, first=False, **kwargs):
        return keras.layers.Conv2D(
            filters, size, use_bias=False, kernel_initializer="he_normal", **kwargs
        )

    inputs = keras.Input(input_shape)
    outputs = _resnet20_graph(
        inputs,
        num_classes,
        conv,
        keras.layers.BatchNormalization,
        keras.layers.Dense,
        keras.layers.GlobalAveragePooling2D,
        deterministic=None,
    )
    return keras.Model(inputs, outputs, name="resnet20")


def _transformer_blocks(h, dim, depth, heads, mlp_dim, dropout, L):
    """Pre-norm transformer encoder blocks (Vaswani et al. 2017, https://arxiv.org/abs/1706.03762, as in ViT):
    h + attention(norm(h)), then h + MLP(norm(h)); `L` is the namespace of layers (keras.layers or
    bayes_keras.layers), so the Bayesian model and its Keras twin share one graph."""
    for i in range(depth):
        x = L.LayerNormalization(epsilon=1e-6, name=f"block{i}_norm1")(h)
        x = L.MultiHeadAttention(heads, dim // heads, dropout=dropout, name=f"block{i}_attention")(
            x, x
        )
        h = keras.layers.Add(name=f"block{i}_add1")([h, x])
        x = L.LayerNormalization(epsilon=1e-6, name=f"block{i}_norm2")(h)
        x = L.Dense(mlp_dim, activation="gelu", name=f"block{i}_mlp1")(x)
        x = L.Dense(dim, name=f"block{i}_mlp2")(x)
        h = keras.layers.Add(name=f"block{i}_add2")([h, x])
    return L.LayerNormalization(epsilon=1e-6, name="norm")(h)


def _patches(inputs, patch_size):
    """(batch, H, W, C) images -> (batch, patches, patch_size^2 C + patches): flattened patches, each with a one-hot
    code of its position, so that the first Dense both embeds the patch and adds a learned position embedding."""
    height, width, channels = inputs.shape[1:]
    if height % patch_size or width % patch_size:
        raise ValueError(
            f"vision_transformer: patch_size {patch_size} must divide the image size {(height, width)}."
        )
    rows, columns = height // patch_size, width // patch_size
    h = keras.layers.Reshape((rows, patch_size, columns, patch_size, channels))(inputs)
    h = keras.layers.Permute((1, 3, 2, 4, 5))(h)
    h = keras.layers.Reshape((rows * columns, patch_size * patch_size * channels))(h)
    positions = keras.ops.zeros_like(h[..., :1]) + keras.ops.eye(rows * columns)
    return keras.layers.Concatenate(name="patches_and_positions")([h, positions])


def _vision_transformer_graph(
    inputs, num_classes, patch_size, dim, depth, heads, mlp_dim, dropout, L, first
):
    h = L.Dense(dim, name="patch_embedding", **first)(_patches(inputs, patch_size))
    h = _transformer_blocks(h, dim, depth, heads, mlp_dim, dropout, L)
    return L.Dense(num_classes, name="head")(L.GlobalAveragePooling1D(name="pool")(h))


def vision_transformer(
    input_shape=(8, 8, 1),
    num_classes=10,
    patch_size=2,
    dim=32,
    depth=2,
    heads=4,
    mlp_dim=64,
    dropout=0.0,
    num_particles=10,
    **model_kwargs,
):
    """A small vision transformer (Dosovitskiy et al. 2021, https://arxiv.org/abs/2010.11929) from particle layers:
    patch embedding with learned positions, `depth` pre-norm encoder blocks of particle attention and MLP, mean
    pooling over patches, a linear head (logits; default likelihood "categorical"). The defaults fit the 8x8
    digits: 16 patches of 2x2, 18k weights per particle.

    Example:
        >>> model = bayes_keras.zoo.vision_transformer((8, 8, 1), 10, num_particles=8)
        >>> model.compile(optimizer=bayes_keras.optimizers.GaussianParticleFlow())
    """
    if dim % heads:
        raise ValueError(f"vision_transformer: dim {dim} must be a multiple of heads {heads}.")
    model_kwargs.setdefault("likelihood", "categorical")
    inputs = keras.Input(input_shape)
    outputs = _vision_transformer_graph(
        inputs,
        num_classes,
        patch_size,
        dim,
        depth,
        heads,
        mlp_dim,
        dropout,
        layers,
        {"num_particles": num_particles},
    )
    return BayesianModel(inputs, outputs, name="bayesian_vision_transformer", **model_kwargs)


def keras_vision_transformer(
    input_shape=(8, 8, 1),
    num_classes=10,
    patch_size=2,
    dim=32,
    depth=2,
    heads=4,
    mlp_dim=64,
    dropout=0.0,
):
    """The same vision transformer from plain Keras layers (logits out): the network to pretrain and then convert
    (`bayesianize`, also with `lora_rank`)."""
    if dim % heads:
        raise ValueError(f"vision_transformer: dim {dim} must be a multiple of heads {heads}.")
    inputs = keras.Input(input_shape)
    outputs = _vision_transformer_graph(
        inputs, num_classes, patch_size, dim, depth, heads, mlp_dim, dropout, keras.layers, {}
    )
    return keras.Model(inputs, outputs, name="vision_transformer")


def _text_transformer_graph(
    tokens, vocabulary_size, num_outputs, dim, depth, heads, mlp_dim, dropout, L, first
):
    length = tokens.shape[1]
    h = L.Embedding(vocabulary_size + 1, dim, mask_zero=True, name="embedding", **first)(tokens)
    positions = keras.ops.zeros_like(
        keras.ops.expand_dims(keras.ops.cast(tokens, "float32"), -1)
    ) + keras.ops.eye(length)
    h = keras.layers.Add(name="add_positions")(
        [h, L.Dense(dim, use_bias=False, name="positions", **first)(positions)]
    )
    h = _transformer_blocks(h, dim, depth, heads, mlp_dim, dropout, L)
    return L.Dense(num_outputs, name="head")(L.GlobalAveragePooling1D(name="pool")(h))


def text_transformer(
    vocabulary_size,
    num_outputs,
    length,
    dim=32,
    depth=1,
    heads=4,
    mlp_dim=64,
    dropout=0.0,
    num_particles=10,
    **model_kwargs,
):
    """A small text transformer from particle layers: token embedding (id 0 is padding, masked in attention and
    pooling) plus a learned position embedding, `depth` pre-norm encoder blocks, masked mean pooling, a linear head
    (default likelihood "categorical", `num_outputs` classes). Input (batch, length) ids in 1..vocabulary_size.

    Example:
        >>> (x, y), _ = bayes_keras.datasets.load_digit_tokens()
        >>> model = bayes_keras.zoo.text_transformer(bayes_keras.datasets.DIGIT_TOKENS, 10, x.shape[1])
    """
    if dim % heads:
        raise ValueError(f"text_transformer: dim {dim} must be a multiple of heads {heads}.")
    if isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 1:
        raise ValueError(
            f"text_transformer length must be a positive integer (the padded sequence length); got "
            f"{length!r}."
        )
    model_kwargs.setdefault("likelihood", "categorical")
    tokens = keras.Input((int(length),), dtype="int32", name="tokens")
    outputs = _text_transformer_graph(
        tokens,
        int(vocabulary_size),
        num_outputs,
        dim,
        depth,
        heads,
        mlp_dim,
        dropout,
        layers,
        {"num_particles": num_particles},
    )
    return BayesianModel(tokens, outputs, name="bayesian_text_transformer", **model_kwargs)


def keras_text_transformer(
    vocabulary_size, num_outputs, length, dim=32, depth=1, heads=4, mlp_dim=64, dropout=0.0
):
    """The same text transformer from plain Keras layers (logits out)."""
    tokens = keras.Input((int(length),), dtype="int32", name="tokens")
    outputs = _text_transformer_graph(
        tokens,
        int(vocabulary_size),
        num_outputs,
        dim,
        depth,
        heads,
        mlp_dim,
        dropout,
        keras.layers,
        {},
    )
    return keras.Model(tokens, outputs, name="text_transformer")
