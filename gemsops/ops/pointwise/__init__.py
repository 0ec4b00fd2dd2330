"""The pointwise family: elementwise arithmetic, comparisons, selection, math functions and
activations, written once as data and run through one generator.

An op is a :class:`~gemsops.ops.pointwise.types.PointwiseOp`: an element function, the
role of each operand and a promotion kind. Its modules, from the kernels up:

* :mod:`~gemsops.ops.pointwise.elementwise`: the ``@triton.jit`` element functions
  (arithmetic, comparisons, the math functions written from ``triton.language``);
* :mod:`~gemsops.ops.pointwise.codegen`: the two kernel templates (flat, and tiled rows
  x columns for broadcast and mixed layouts) an element function is passed to as a
  constexpr, and their launchers;
* :mod:`~gemsops.ops.pointwise.types`: the op record and torch's type rules (result
  type, compute dtype, scalar conversion);
* :mod:`~gemsops.ops.pointwise.iterator`: torch's host-side TensorIterator work
  (:func:`~gemsops.ops.pointwise.iterator.run`: promotion, broadcasting, scalars, out=
  and in-place checks, the output's layout);
* :mod:`~gemsops.ops.pointwise.arith`: add ... pow, comparisons, logic, clamp, where,
  masked_fill, and the FILL and COPY records other families run;
* :mod:`~gemsops.ops.pointwise.activation`: exp ... tanh, sigmoid, relu, gelu, silu,
  threshold and the backward ops autograd calls for them.

Each host function is declared with :func:`gemsops.declare.op` next to its definition:
the aten overloads it serves, its ``out=`` overloads and its in-place ones. The host
functions take ``out`` and ``inplace`` themselves (``run`` writes both as torch does), so
the derived overloads call them directly.
"""
