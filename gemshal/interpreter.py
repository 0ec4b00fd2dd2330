"""Switching Triton to its interpreter at run time, after Triton may have been imported.

Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` is applied. Kernels gemsops
imports later are covered by setting the knob, but Triton's own library functions
(``tl.sum``, ``tl.cdiv``, ``tl.max``...) were decorated when ``triton`` was first
imported, by detection's driver probe or by the user. Left as compiled-mode
functions they fail inside interpreted kernels ("Cannot call @triton.jit'd outside
of the scope of a kernel"). :func:`use_interpreter` replaces those already-built
functions with interpreted ones wherever Triton's language modules refer to them:
module attributes, and the tensor-method wrappers that close over them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["use_interpreter"]


def _convert_library_functions() -> int:
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    modules = [
        module
        for name, module in list(sys.modules.items())
        if module is not None and name.startswith("triton.language")
    ]
    replaced: dict[int, Any] = {}
    for module in modules:
        for attr, value in list(vars(module).items()):
            if type(value) is JITFunction:
                new = replaced.get(id(value))
                if new is None:
                    new = replaced[id(value)] = InterpretedFunction(value.fn)
                setattr(module, attr, new)
    # Methods such as ``x.sum()`` are wrappers closing over the library function.
    for module in modules:
        for value in list(vars(module).values()):
            if isinstance(value, type):
                for member in vars(value).values():
                    for cell in getattr(member, "__closure__", None) or ():
                        swap = replaced.get(id(cell.cell_contents))
                        if swap is not None:
                            cell.cell_contents = swap
    return len(replaced)


def use_interpreter() -> int:
    """Make Triton interpret kernels on the CPU from now on.

    Returns:
        How many of Triton's library functions had to be converted (0 when Triton
        was imported with the interpreter already on).
    """
    os.environ["TRITON_INTERPRET"] = "1"
    import triton

    triton.knobs.runtime.interpret = True
    return _convert_library_functions()
