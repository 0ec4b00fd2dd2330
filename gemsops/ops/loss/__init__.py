"""Losses: negative log-likelihood (:mod:`~gemsops.ops.loss.nll`) and the fused cross
entropy (:mod:`~gemsops.ops.loss.cross_entropy`), sharing their input handling
(:mod:`~gemsops.ops.loss.inputs`) and reduction (:mod:`~gemsops.ops.loss.reduction`)."""
