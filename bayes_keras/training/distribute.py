"""Training on several devices and machines with TensorFlow's own engine (tf.distribute).

BayesianModel runs under `tf.distribute.MirroredStrategy` (one machine, several devices) and
`tf.distribute.MultiWorkerMirroredStrategy` (several machines): create the model and compile it inside
`strategy.scope()`, then call fit / evaluate / predict as usual (docs/distributed.md).

Data parallel: every replica holds all N weight sets and runs the forward and backward pass of its
share of the global batch. Everything the update needs from the batch is reduced across replicas in
one place, `reduce_step` (below; the training step calls it), before the optimizer sees it: gradients and per-particle
log likelihoods are summed (each replica's loss is scaled by the GLOBAL batch size, and carries 1 / R
of the prior, so that the sum is the single-device value), and curvature records (per-example layer
inputs and output gradients) are gathered along the batch axis. After that every replica holds the
same inputs, computes the same update, and the guard (`BayesianOptimizer.apply`) decides for all
replicas at once (`all_replicas_agree`), so the replicas stay identical. Particle parallel
(`compile(parallel="particles")`, bayes_keras/training/particle_parallel.py) splits the particles instead.

Random draws inside a step are keyed by (seed, step), never by replica; a draw per example (dropout
masks, the true Fisher's sampled labels) is made for the global batch and each replica takes its
rows (`replica_rows`), so the draws equal those of one device on the same global batch.
"""

import itertools
import weakref

import tensorflow as tf

# Strategies whose replicas each run the whole model on their share of the batch, with mirrored
# variables: what this module's reductions assume.
SUPPORTED = (
    tf.distribute.MirroredStrategy,
    tf.distribute.MultiWorkerMirroredStrategy,
    tf.distribute.OneDeviceStrategy,
)


def check_strategy(strategy=None):
    """Raise a clear error for a strategy the library cannot train under (names what works)."""
    if strategy is None:
        if not tf.distribute.has_strategy():
            return  # the default strategy: one device
        strategy = tf.distribute.get_strategy()
    if isinstance(strategy, SUPPORTED) or type(strategy).__name__.startswith(
        "_DefaultDistributionStrategy"
    ):
        return
    raise NotImplementedError(
        f"bayes_keras trains under tf.distribute.MirroredStrategy (several devices of one machine), "
        f"MultiWorkerMirroredStrategy (several machines) and OneDeviceStrategy; got {type(strategy).__name__}. "
        "Its replicas would not each hold the particles and see the reduced batch (a ParameterServerStrategy "
        "updates variables on parameter servers; TPUStrategy compiles with XLA, which the grouped particle "
        "convolutions do not use). See docs/distributed.md."
    )


_KEYED = weakref.WeakSet()  # strategies whose collectives use a key block of their own
_KEY_BLOCKS = itertools.count(1)
_KEY_BLOCK_SIZE = 10_000  # group keys per strategy (a MirroredStrategy uses one per device set)


def own_collective_keys(strategy):
    """Give a MirroredStrategy collective group keys no other strategy in this process uses.

    Every MirroredStrategy numbers its collective group keys from 1 and their instances from the same
    start, and TensorFlow's collective executor remembers an instance's kind (all-reduce or all-gather)
    for the whole process: a second strategy whose step issues its collectives in another order then
    fails with "Collective instance 101 expected type 0 ... but got type 2" (tensorflow/tensorflow#62790).
    The first model compiled under a strategy rebuilds its collective ops on a fresh block of group keys
    (the strategy's own constructor argument for this, `_collective_key_base`, is meant for TensorFlow's
    tests). A MultiWorkerMirroredStrategy, one per process, keeps its keys: every worker must agree on
    them, and the blocks here start above the ones it uses."""
    if not isinstance(strategy, tf.distribute.MirroredStrategy) or strategy in _KEYED:
        return
    extended = strategy.extended
    # another TensorFlow: keep its keys
    if not hasattr(extended, "_make_collective_ops_with_fallbacks"):
        return
    previous = getattr(extended, "_collective_ops", None)
    extended._collective_key_base = next(_KEY_BLOCKS) * _KEY_BLOCK_SIZE
    extended._collective_ops = extended._make_collective_ops_with_fallbacks()
    if getattr(extended, "_cross_device_ops", None) is previous:  # not one the user passed
        extended._cross_device_ops = extended._collective_ops
    _KEYED.add(strategy)


def replica_context():
    """The replica context when running in a replica of a strategy with several replicas, else None."""
    if tf.distribute.in_cross_replica_context():
        return None
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return context


def multi_worker(strategy=None):
    """Whether `strategy` (default: the current one) is a MultiWorkerMirroredStrategy over several workers."""
    strategy = strategy or tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    jobs = strategy.cluster_resolver.cluster_spec().as_dict()
    return sum(len(tasks) for tasks in jobs.values()) > 1


def num_replicas():
    context = replica_context()
    return 1 if context is None else context.num_replicas_in_sync


def sum_across_replicas(values):
    """The sum over replicas of each tensor in the list `values` (unchanged on one replica)."""
    context = replica_context()
    if context is None or not values:
        return list(values)
    values = [tf.convert_to_tensor(v) for v in values]
    summed = [None] * len(values)
    for dtype in {
        v.dtype for v in values
    }:  # one all-reduce per dtype (it packs its tensors into one buffer)
        positions = [i for i, v in enumerate(values) if v.dtype == dtype]
        for i, total in zip(
            positions,
            context.all_reduce(tf.distribute.ReduceOp.SUM, [values[i] for i in positions]),
        ):
            summed[i] = total
    return summed


def batch_rows(local_batch):
    """(global batch size, first row of this replica's examples in the global batch), as int32 tensors.

    tf.distribute splits a global batch into consecutive pieces in replica order; the pieces may differ
    in size (the last, partial batch)."""
    local_batch = tf.cast(local_batch, tf.int32)
    context = replica_context()
    if context is None:
        return local_batch, tf.constant(0, tf.int32)
    sizes = context.all_gather(tf.reshape(local_batch, (1,)), axis=0)
    replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
    offset = tf.reduce_sum(sizes * tf.cast(tf.range(tf.size(sizes)) < replica, tf.int32))
    return tf.reduce_sum(sizes), offset


def gather(tensor, axis=0):
    """The replicas' `tensor`s concatenated along `axis`, in replica order (unchanged on one replica)."""
    context = replica_context()
    if context is None or tensor is None:
        return tensor
    # tf.identity places the tensor on this replica's device: a function's input placeholder has none, and
    # with one replica per worker (MultiWorkerMirroredStrategy) all_gather needs it as its destination.
    gathered = context.all_gather(tf.identity(tensor), axis=axis)
    shape = list(tensor.shape)
    shape[axis] = None if shape[axis] is None else shape[axis] * context.num_replicas_in_sync
    gathered.set_shape(shape)  # all_gather forgets the static shape
    return gathered


def gather_examples(tensor):
    """`tensor` (batch, ...) of this replica's examples -> (global batch, ...) of all replicas', in the
    global batch's order (unchanged on one replica)."""
    return gather(tensor, axis=0)


def gather_batch(data):
    """A structure of this replica's (batch, ...) tensors -> the whole global batch (particle parallel)."""
    return tf.nest.map_structure(lambda t: None if t is None else gather_examples(t), data)


def particle_slice_of(layer):
    """N, the model's particle count, when `layer` computes a replica's slice of the particles (particle
    parallel: `ParticleSlices` marks every layer of its copy with `particle_slice_of = N`), else None."""
    return getattr(layer, "particle_slice_of", None)


def particles_drawn(layer, count):
    """How many particles a per-particle draw of `layer` covers: all N in a particle slice, else `count`."""
    total = particle_slice_of(layer)
    return count if total is None else total


def particle_columns(layer, draw, count, axis=1):
    """This replica's `count` particles of `draw`, a per-particle draw of `layer` made for
    `particles_drawn(layer, count)`: particles [r count, (r + 1) count) on replica r."""
    if particle_slice_of(layer) is None:
        return draw
    start = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int32) * count
    begin = [0] * len(draw.shape)
    size = [-1] * len(draw.shape)
    begin[axis], size[axis] = start, count
    return tf.slice(draw, tf.stack([tf.cast(b, tf.int32) for b in begin]), size)


def replica_rows(draw, local_batch):
    """This replica's rows of `draw(global_batch)`, a draw made for the whole global batch (keyed by
    (seed, step) only), so that each example gets what it would get on one device."""
    context = replica_context()
    if context is None:
        return draw(local_batch)
    total, offset = batch_rows(local_batch)
    return draw(total)[offset : offset + local_batch]


def distributed(layer):
    """Whether `layer` runs split: in a replica of several (data parallel), or on a slice of the particles."""
    return replica_context() is not None or particle_slice_of(layer) is not None


def global_draw(layer, draw, shape, particle_axis=1, rows=True):
    """A random draw made as one device makes it, this replica's part returned. `draw(full_shape)` (keyed by the
    layer's seed generator, whose state every replica shares) is called with the global batch in axis 0 (`rows`:
    False for a draw shared by the whole batch) and every particle in `particle_axis` (None: no particle axis, a
    layer before the particles); this replica's rows (data parallel) or particles (particle parallel, where every
    replica has the whole batch) are kept. `shape`: this replica's shape (ints or scalar tensors)."""
    shape = list(shape)
    count = None if particle_axis is None else shape[particle_axis]

    def full(batch):
        drawn = list(shape)
        if rows:
            drawn[0] = batch
        if particle_axis is not None:
            drawn[particle_axis] = particles_drawn(layer, count)
        out = draw(tf.stack([tf.cast(d, tf.int32) for d in drawn]))
        return (
            out
            if particle_axis is None
            else particle_columns(layer, out, count, axis=particle_axis)
        )

    if particle_slice_of(layer) is not None or not rows:
        return full(shape[0])
    return replica_rows(full, shape[0])


def all_replicas_agree(condition):
    """True only where `condition` holds on every replica (a guard's decision, taken once for all)."""
    context = replica_context()
    if context is None:
        return condition
    failed = context.all_reduce(
        tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(condition), tf.float32)
    )
    return tf.equal(failed, 0.0)


def guarded(condition, on_true, on_false, args=()):
    """Run `on_true(*args)` if `condition` else `on_false(*args)`, in every replica; returns `condition`.

    `condition` must be the same on every replica (see `all_replicas_agree`). On one replica: a tf.cond.
    On several, the branches may write variables whose replica-context updates need a merge_call (an
    optimizer's `iterations`), which tf.distribute refuses inside a tf.cond taken in a replica: the
    cond is taken once in cross-replica context and each branch runs in every replica
    (call_for_each_replica), with `args` (tensors of each replica, e.g. its new values) passed
    through, as Keras' LossScaleOptimizer does."""
    context = replica_context()
    if context is None:

        def branch(fn):
            def run():
                fn(*args)
                return tf.constant(True)

            return run

        tf.cond(condition, branch(on_true), branch(on_false))
        return condition

    def merge(strategy, condition, *args):
        decided = strategy.experimental_local_results(condition)[0]

        def branch(fn):
            def run():
                strategy.extended.call_for_each_replica(fn, args=args)
                return tf.constant(True)

            return run

        tf.cond(decided, branch(on_true), branch(on_false))

    context.merge_call(merge, args=(condition,) + tuple(args))
    return condition


def sum_gradients_and(grads, others, reduce_gradients=True):
    """(grads, others) summed over the replicas; None gradients stay None, and with reduce_gradients=False
    the gradients stay this replica's (a Keras optimizer sums them itself)."""
    present = [i for i, g in enumerate(grads) if g is not None] if reduce_gradients else []
    summed = sum_across_replicas([grads[i] for i in present] + list(others))
    grads = list(grads)
    for i, g in zip(present, summed):
        grads[i] = g
    return grads, summed[len(present) :]


def reduce_step(grads, scaled_loglik, loss, outputs, records, reduce_gradients, particle_parallel):
    """A replica's step -> the global step: gradients and losses summed over the replicas. Data parallel: the
    per-particle log likelihoods summed too, the curvature records' per-example tensors gathered along the
    batch, and the gradients left to a Keras optimizer that sums them itself (`reduce_gradients=False`).
    Particle parallel: the replicas' particles' log likelihoods and outputs gathered along the particles."""
    if particle_parallel:
        grads, (loss,) = sum_gradients_and(grads, [loss])
        return grads, gather(scaled_loglik), loss, gather(outputs, axis=1)
    grads, (scaled_loglik, loss) = sum_gradients_and(grads, [scaled_loglik, loss], reduce_gradients)
    for r in records:
        r.inputs = gather_examples(r.inputs)
        r.output_gradients = gather_examples(r.output_gradients)
        r.sampled_output_gradients = gather_examples(r.sampled_output_gradients)
        if r.extras is not None:
            r.extras = {k: gather_examples(v) for k, v in r.extras.items()}
    return grads, scaled_loglik, loss, outputs


def results_of_all_replicas(metrics, logs):
    """Every metric's result over all replicas' examples so far: its variables summed over the replicas
    (averaged where declared so), then its `stateless_result`. A replica's own results would be averaged
    by Keras with equal weights, wrong when the replicas' shares of a batch differ (a global batch the
    replicas do not divide: evaluate's and the validation's numbers)."""
    results = {}
    for metric in metrics:
        variables = list(metric.variables)
        # (tf.identity: a read on this replica's device; the variables of a SyncOnRead metric under
        # MultiWorkerMirroredStrategy read as tensors without one, which its all-reduce refuses)
        values = sum_across_replicas([tf.identity(v.value) for v in variables])
        values = [
            value / num_replicas() if getattr(v, "aggregation", "sum") == "mean" else value
            for v, value in zip(variables, values)
        ]
        result = metric.stateless_result(values)
        if isinstance(result, dict):
            results.update(result)
        else:
            results[metric.name] = result
    return {name: results.get(name, value) for name, value in logs.items()}
