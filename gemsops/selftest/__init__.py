"""``gemsops selftest``: which ops pass on this device, checked the way the test suite checks them.

A vendor runs it on its hardware. For each op and dtype of the table below it draws
examples with the test suite's strategies (:mod:`gemsops.testing.strategies`), calls
the op through aten inside ``use_gems()`` (the path users take), computes torch's
float64 reference on the CPU (:mod:`gemsops.testing.reference`) and compares them
with the suite's tolerance table (:mod:`gemsops.testing.tolerance`). Hypothesis
shrinks a failure to its smallest example. Each (op, dtype) ends as one of:

- ``passed``: every example matched torch;
- ``failed``: the smallest failing example, with the error or the difference;
- ``handed back``: gemsops handed every call back to torch, with the reasons;
- ``not implemented``: gemsops does not serve the op on this vendor (its unused list).

Every op ``gemsops ops`` lists is checked by a case (its ``aten`` names) or named in
:data:`UNCHECKED` with the reason; tests/test_selftest.py enforces it. Backward ops are
checked through ``torch.autograd.grad`` of their forward, the ``_foreach_*`` ops and the
fused optimizers through torch's calls on lists of drawn tensors, and the random ops
through properties that hold for any random stream (gemsops draws its own Philox
numbers, not torch's).
"""

from __future__ import annotations

from gemsops.selftest.cases import CASES as CASES
from gemsops.selftest.cases import UNCHECKED as UNCHECKED
from gemsops.selftest.cli import add_parser as add_parser
from gemsops.selftest.cli import main as main
from gemsops.selftest.records import DEFAULT_EXAMPLES as DEFAULT_EXAMPLES
from gemsops.selftest.records import OUTCOMES as OUTCOMES
from gemsops.selftest.records import Case as Case
from gemsops.selftest.records import Row as Row
from gemsops.selftest.runner import check as check
from gemsops.selftest.runner import run as run

__all__ = [
    "CASES",
    "DEFAULT_EXAMPLES",
    "OUTCOMES",
    "UNCHECKED",
    "Case",
    "Row",
    "add_parser",
    "check",
    "main",
    "run",
]
