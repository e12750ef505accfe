"""BlockwiseGaussian: q over several independent Gaussian blocks, as one TFP distribution."""

import tensorflow as tf
import tensorflow_probability as tfp


class BlockwiseGaussian(tfp.distributions.Blockwise):
    """`tfp.distributions.Blockwise` of Gaussian blocks (MGVBP's "layer" and "kronecker" posteriors), with
    the moments TFP's Blockwise leaves out: `stddev()` and `variance()` concatenate the blocks' own."""

    def _stddev(self):
        return tf.concat([d.stddev() for d in self.distributions], axis=-1)

    def _variance(self):
        return tf.square(self._stddev())
