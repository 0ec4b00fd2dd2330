"""Random ops: dropout's forward and backward and in-place Bernoulli sampling
(:mod:`~gemsops.ops.random.dropout`), the in-place fills uniform_, normal_,
exponential_ and random_ (:mod:`~gemsops.ops.random.fill`) and multinomial sampling
(:mod:`~gemsops.ops.random.sample`), all drawing counter-based Philox numbers keyed by
torch's generators (:mod:`~gemsops.ops.random.seed`): reproducible under
``torch.manual_seed``, each call advancing the generator, but not torch's own stream."""
