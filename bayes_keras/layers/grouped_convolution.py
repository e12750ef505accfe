"""Grouped 2-D convolution whose gradients run on every device, with or without oneDNN.

A particle convolution folds N particles into the channel axis and runs ONE grouped convolution
(groups = N). TensorFlow's forward grouped convolution runs everywhere, but its gradient kernels
(Conv2DBackpropInput / Conv2DBackpropFilter with groups > 1) exist only on GPU and in the oneDNN
CPU build path. TensorFlow turns oneDNN on by default only on x86 CPUs with AVX-512-class features,
so on AMD, older Intel and many cloud CPUs the Eigen kernels run and raise "Gradients for grouped
convolutions are not supported on CPU".

`grouped_conv2d` keeps the native forward op and, where the native gradient is unavailable, gives it
a custom gradient made of FORWARD convolutions only (which the Eigen kernels do have):

- input gradient: the correlation of the output gradient with the spatially flipped kernel whose
  in/out channels are swapped per group, dilation d, padded to the input's size: dx[u] = sum_p
  dy[u - p d] k[p] (a transposed convolution written as a grouped forward convolution); for stride
  s > 1 one stride-1 convolution per phase of the input (see `_input_gradient_by_phases`);
- kernel gradient: dk[p, q, c, g f] = sum_{b,h,w} x_pad[b, h s + p d, w s + q d, g c] dy[b, h, w, g f],
  which is a grouped forward convolution of x with channels and batch swapped (the C input channels
  become the batch, the B examples of group g the g-th channel group) by dy used as a filter
  (stride d, dilation s), cropped to the kernel's size.

The same custom gradient serves dilated convolutions, whose gradient kernels the Eigen CPU path
lacks too. Both cost the arithmetic of the native backward passes; measured (benchmarks/grouped_conv.py)
the native gradient is faster where it exists, so it is used there.

Which gradient runs is decided once per process and case by `gradient_implementation(dtype, grouped,
dilated)`: "native" when a GPU is visible or a tiny probe of the native gradient ops runs on this CPU,
"portable" otherwise. `set_gradient_implementation("native" | "portable" | "auto")` overrides it
(tests use it to run the portable path on machines where oneDNN is on).
"""

import tensorflow as tf

_IMPLEMENTATIONS = ("auto", "native", "portable")
_choice = {"requested": "auto", "resolved": {}}


def set_gradient_implementation(name):
    """Choose the grouped-convolution gradient: "auto" (default), "native" or "portable".

    Takes effect for convolutions traced afterwards (a compiled train function keeps its choice).
    """
    if name not in _IMPLEMENTATIONS:
        raise ValueError(
            f"Grouped convolution gradient must be one of {_IMPLEMENTATIONS}; got {name!r}."
        )
    _choice["requested"] = name


def gradient_implementation(dtype="float32", grouped=True, dilated=False):
    """The gradient in use for a convolution of `dtype` (grouped: groups > 1; dilated: a dilation rate
    > 1): "native" or "portable". "auto" is resolved by a one-time probe per case: oneDNN's CPU kernels
    cover grouped float32 and bfloat16, not float16 or float64, and the Eigen CPU kernels have neither
    grouped nor dilated gradients (Keras' own dilated Conv1D does not train there)."""
    if _choice["requested"] != "auto":
        return _choice["requested"]
    key = (tf.as_dtype(dtype), bool(grouped), bool(dilated))
    if key not in _choice["resolved"]:
        _choice["resolved"][key] = "native" if native_gradient_runs(*key) else "portable"
    return _choice["resolved"][key]


def native_gradient_runs(dtype=tf.float32, grouped=True, dilated=False):
    """True when the native convolution gradient ops run on the default device for this case."""
    if tf.config.list_logical_devices("GPU"):
        return True  # cuDNN has grouped and dilated convolution gradients
    with tf.init_scope():  # eager, even when called while a tf.function is being traced
        # The two gradient ops themselves (a GradientTape does not record under init_scope).
        channels, rate = (2 if grouped else 1), (2 if dilated else 1)
        size = 2 + rate  # a 2 x 2 kernel of span rate + 1 gives a 2 x 2 output
        x = tf.ones((1, size, size, channels), dtype)
        kernel, dy = tf.ones((2, 2, 1, 2), dtype), tf.ones((1, 2, 2, 2), dtype)
        ones = [1, 1, 1, 1]
        try:
            dx = tf.raw_ops.Conv2DBackpropInput(
                input_sizes=tf.shape(x),
                filter=kernel,
                out_backprop=dy,
                strides=ones,
                padding="VALID",
                dilations=[1, rate, rate, 1],
            )
            dk = tf.raw_ops.Conv2DBackpropFilter(
                input=x,
                filter_sizes=tf.shape(kernel),
                out_backprop=dy,
                strides=ones,
                padding="VALID",
                dilations=[1, rate, rate, 1],
            )
            # all-ones operands: every entry of dx is a positive count; dk's entries are 4 each
            return bool(tf.reduce_all(dx > 0)) and bool(
                tf.reduce_all(tf.equal(dk, tf.cast(4.0, dtype)))
            )
        except (
            tf.errors.InvalidArgumentError,
            tf.errors.UnimplementedError,
            tf.errors.NotFoundError,
        ):
            return False


def supports_jit(groups):
    """Whether a convolution with `groups` should be compiled by XLA here: XLA's CPU grouped
    convolution is far slower than TensorFlow's kernel, and so are the XLA alternatives (a
    per-particle loop, im2col; measured in docs/architecture.md, "XLA"); ungrouped ones and GPUs are
    fine. Particle conv layers report it as Keras' `supports_jit`."""
    return groups == 1 or bool(tf.config.list_logical_devices("GPU"))


def output_length(size, k, s, d, padding):
    """Output length of one spatial axis ('same' / 'valid', any case; None when unknown)."""
    if size is None:
        return None
    if padding.upper() == "SAME":
        return (size + s - 1) // s
    return (size - (k - 1) * d - 1) // s + 1


def _output_size_and_pads(size, k, s, d, padding):
    """Output length and (before, after) padding of one spatial axis, as TensorFlow pads 'SAME'."""
    out = output_length(size, k, s, d, padding)
    if padding == "SAME":
        total = tf.maximum((out - 1) * s + (k - 1) * d + 1 - size, 0)
        return out, total // 2, total - total // 2
    return out, 0, 0


def grouped_conv2d(x, kernel, groups, strides, padding, dilations):
    """Grouped (or dilated) 2-D convolution (channels_last) with gradients on every device.

    Further arguments:

    - strides, dilations: pairs of ints (strides > 1 together with dilations > 1 is not supported,
      as in Keras).

    Args:
        x: (B, H, W, groups * C) input.
        kernel: (kh, kw, C, groups * F) filters; output channel block g reads input block g.
        groups: number of groups.
        padding: "SAME" or "VALID".
    Returns:
        (B, H', W', groups * F).
    """
    strides, dilations = tuple(strides), tuple(dilations)

    def forward(inputs, filters):
        return tf.nn.conv2d(inputs, filters, strides=strides, padding=padding, dilations=dilations)

    grouped, dilated = groups > 1, max(dilations) > 1
    if not (grouped or dilated) or gradient_implementation(x.dtype, grouped, dilated) == "native":
        return forward(x, kernel)
    return portable_grouped_conv2d(forward, groups, strides, padding, dilations)(x, kernel)


def portable_grouped_conv2d(forward, groups, strides, padding, dilations):
    @tf.custom_gradient
    def conv(x, kernel):
        def grad(dy):
            if max(strides) > 1:  # (dilation is 1: Conv2D refuses strides > 1 with dilation > 1)
                dx = _input_gradient_by_phases(dy, kernel, tf.shape(x), groups, strides, padding)
            else:
                dx = _input_gradient(dy, kernel, tf.shape(x), groups, strides, padding, dilations)
            return dx, _kernel_gradient(x, dy, kernel.shape, groups, strides, padding, dilations)

        return forward(x, kernel), grad

    return conv


def _input_gradient(dy, kernel, x_shape, groups, strides, padding, dilations):
    """dx: the zero-upsampled dy correlated with the flipped, per-group transposed kernel."""
    kh, kw, channels, filters = (
        kernel.shape[0],
        kernel.shape[1],
        kernel.shape[2],
        kernel.shape[3] // groups,
    )
    (sh, sw), (dh, dw) = strides, dilations
    height, width = x_shape[1], x_shape[2]
    out_h, top_h, _ = _output_size_and_pads(height, kh, sh, dh, padding)
    out_w, top_w, _ = _output_size_and_pads(width, kw, sw, dw, padding)
    upsampled = dy
    if sh > 1 or sw > 1:  # s - 1 zeros after every row / column, then drop the trailing ones
        upsampled = tf.pad(
            dy[:, :, None, :, None, :], [[0, 0], [0, 0], [0, sh - 1], [0, 0], [0, sw - 1], [0, 0]]
        )
        upsampled = tf.reshape(
            upsampled, tf.stack([tf.shape(dy)[0], out_h * sh, out_w * sw, groups * filters])
        )
        upsampled = upsampled[:, : (out_h - 1) * sh + 1, : (out_w - 1) * sw + 1]
    span_h, span_w = (out_h - 1) * sh + 1, (out_w - 1) * sw + 1
    before_h, before_w = (kh - 1) * dh - top_h, (kw - 1) * dw - top_w
    after_h = height + (kh - 1) * dh - span_h - before_h
    after_w = width + (kw - 1) * dw - span_w - before_w
    upsampled = tf.pad(
        upsampled, tf.stack([[0, 0], [before_h, after_h], [before_w, after_w], [0, 0]])
    )
    # k[p, q, c, g f] -> k'[kh-1-p, kw-1-q, f, g c]: flipped, in/out swapped inside each group.
    swapped = tf.reshape(kernel, (kh, kw, channels, groups, filters))
    swapped = tf.transpose(tf.reverse(swapped, [0, 1]), [0, 1, 4, 3, 2])
    swapped = tf.reshape(swapped, (kh, kw, filters, groups * channels))
    return tf.nn.conv2d(upsampled, swapped, strides=1, padding="VALID", dilations=dilations)


def _kernel_gradient(x, dy, kernel_shape, groups, strides, padding, dilations):
    """dk: x with batch and channels swapped, correlated with dy as the filter (stride d, dilation s)."""
    kh, kw, channels, filters = (
        kernel_shape[0],
        kernel_shape[1],
        kernel_shape[2],
        kernel_shape[3] // groups,
    )
    (sh, sw), (dh, dw) = strides, dilations
    shape = tf.shape(x)
    batch, height, width = shape[0], shape[1], shape[2]
    _, top_h, bottom_h = _output_size_and_pads(height, kh, sh, dh, padding)
    _, top_w, bottom_w = _output_size_and_pads(width, kw, sw, dw, padding)
    padded = tf.pad(x, tf.stack([[0, 0], [top_h, bottom_h], [top_w, bottom_w], [0, 0]]))
    pshape = tf.shape(padded)
    # images (C, H_pad, W_pad, groups * B): channel block g holds group g's B examples.
    images = tf.reshape(padded, tf.stack([batch, pshape[1], pshape[2], groups, channels]))
    images = tf.reshape(
        tf.transpose(images, [4, 1, 2, 3, 0]),
        tf.stack([channels, pshape[1], pshape[2], groups * batch]),
    )
    # filter (H', W', B, groups * F): dy, whose B examples are each group's input channels.
    dshape = tf.shape(dy)
    taps = tf.reshape(dy, tf.stack([batch, dshape[1], dshape[2], groups, filters]))
    taps = tf.reshape(
        tf.transpose(taps, [1, 2, 0, 3, 4]),
        tf.stack([dshape[1], dshape[2], batch, groups * filters]),
    )
    out = tf.nn.conv2d(images, taps, strides=dilations, padding="VALID", dilations=strides)
    return tf.transpose(out[:, :kh, :kw], [1, 2, 0, 3])


# -- strided layers: the input gradient as one stride-1 convolution per phase ----------------------
# With stride s, row u = q s + r of the padded input only meets kernel rows p = r + j s, so
# dx_pad[q s + r] = sum_j dy[q - j] k[r + j s]: s_h s_w stride-1 convolutions of dy with the phases'
# sub-kernels instead of one on an s^2-times larger zero-upsampled gradient (faster on a stride-2
# ResNet layer). The same split of the kernel gradient into phases was slower than one dilated
# convolution, so dk keeps `_kernel_gradient` (both measured by benchmarks/grouped_conv.py).


def _input_gradient_by_phases(dy, kernel, x_shape, groups, strides, padding):
    kh, kw, channels, filters = (
        kernel.shape[0],
        kernel.shape[1],
        kernel.shape[2],
        kernel.shape[3] // groups,
    )
    (sh, sw) = strides
    height, width = x_shape[1], x_shape[2]
    out_h, top_h, bottom_h = _output_size_and_pads(height, kh, sh, 1, padding)
    out_w, top_w, bottom_w = _output_size_and_pads(width, kw, sw, 1, padding)
    phases_h = (height + top_h + bottom_h + sh - 1) // sh  # rows of one phase of the padded input
    phases_w = (width + top_w + bottom_w + sw - 1) // sw
    batch = tf.shape(dy)[0]
    kernel = tf.reshape(kernel, (kh, kw, channels, groups, filters))
    rows = []
    for rh in range(sh):
        cols = []
        for rw in range(sw):
            sub = kernel[rh::sh, rw::sw]  # the taps that meet phase (rh, rw)
            jh, jw = sub.shape[0], sub.shape[1]
            if jh == 0 or jw == 0:
                cols.append(
                    tf.zeros(tf.stack([batch, phases_h, phases_w, groups * channels]), dy.dtype)
                )
                continue
            swapped = tf.reshape(
                tf.transpose(tf.reverse(sub, [0, 1]), [0, 1, 4, 3, 2]),
                (jh, jw, filters, groups * channels),
            )
            padded = tf.pad(
                dy,
                tf.stack([[0, 0], [jh - 1, phases_h - out_h], [jw - 1, phases_w - out_w], [0, 0]]),
            )
            cols.append(tf.nn.conv2d(padded, swapped, strides=1, padding="VALID"))
        rows.append(tf.stack(cols, axis=3))  # (B, Qh, Qw, sw, G C)
    full = tf.reshape(
        tf.stack(rows, axis=2), tf.stack([batch, phases_h * sh, phases_w * sw, groups * channels])
    )
    return full[:, top_h : top_h + height, top_w : top_w + width]
