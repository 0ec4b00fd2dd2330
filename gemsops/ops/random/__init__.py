"""Random ops: dropout's forward and backward and in-place Bernoulli sampling
(:mod:`~gemsops.ops.random.dropout`), drawing counter-based Philox numbers keyed by
torch's generators (:mod:`~gemsops.ops.random.seed`)."""
