"""Every private Triton name gemshal uses, in one leaf module.

Triton's launch ABI, its interpreter hooks, its scratch allocator variable and its
``MockTensor`` are not public API and have moved between 3.x releases. Nothing else in
gemshal imports a private Triton name: the launch wing (:mod:`gemshal.kernel`), the
device module and detection come here, and a missing name becomes one clear reason
(the direct launch path off, say) instead of an AttributeError deep in a launch.

Nothing here imports Triton at module import; each helper imports what it needs.

**The interpreter switch.** Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` is
applied. Kernels gemsops imports later are covered by setting the knob, but Triton's
own library functions (``tl.sum``, ``tl.cdiv``, ``tl.max``...) were decorated when
``triton`` was first imported, by detection's driver probe or by the user. Left as
compiled-mode functions they fail inside interpreted kernels ("Cannot call @triton.jit'd outside
of the scope of a kernel"). :func:`use_interpreter` replaces those already-built
functions with interpreted ones wherever Triton's language modules refer to them:
module attributes, and the tensor-method wrappers that close over them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "CHECKED_TRITON",
    "Runtime",
    "allocator_state",
    "is_jit_function",
    "minor_version",
    "mock_dtype",
    "out_of_resources",
    "use_interpreter",
]

CHECKED_TRITON = ("3.6",)
"""Triton minor versions whose launch ABI the direct path was read and checked on."""


def minor_version(version: str) -> str:
    """``"3.6"`` of ``"3.6.0"``."""
    return ".".join(version.split(".")[:2])


class Runtime:
    """The private runtime names a direct launch needs, looked up once.

    Raises (at construction):
        ImportError, AttributeError: the installed Triton keeps them elsewhere.
    """

    def __init__(self) -> None:
        import triton
        from triton import knobs
        from triton.runtime.driver import driver

        self.version = triton.__version__
        self.runtime = knobs.runtime
        active = driver.active
        self.get_device: Callable[[], int] = active.get_current_device
        self.get_stream: Callable[[int], int] = active.get_current_stream
        enter = self.runtime.launch_enter_hook
        leave = self.runtime.launch_exit_hook
        if not hasattr(enter, "calls") or not hasattr(leave, "calls"):
            raise AttributeError("knobs.runtime.launch_enter_hook has no 'calls' list")
        self.hook_chain = type(enter)
        # Runtime debug is an environment knob (read from os.environ at each access):
        # read once here; the hook chains are checked on every launch.
        self.debug = bool(self.runtime.debug)

    def quiet(self) -> bool:
        """No launch hook installed (a profiler such as proton installs one) and no
        runtime debug: nothing needs ``JITFunction.run``."""
        rt = self.runtime
        enter, leave = rt.launch_enter_hook, rt.launch_exit_hook
        chain = self.hook_chain
        return (
            type(enter) is chain
            and not enter.calls
            and type(leave) is chain
            and not leave.calls
            and not self.debug
        )


def is_jit_function(fn: object) -> bool:
    """Whether ``fn`` is a compiled-mode ``@triton.jit`` function (not interpreted)."""
    from triton.runtime.jit import JITFunction

    return type(fn) is JITFunction


def mock_dtype(value: Any) -> Any:
    """``value``, or a stand-in tensor when it is a dtype (``warmup`` arguments)."""
    from triton.runtime.jit import MockTensor

    return MockTensor.wrap_dtype(value)


def same_binary(a: Any, b: Any) -> bool:
    """Whether two compiled kernels are one compile: the same object, or the same compile
    hash (Triton's cache key over source, signature, constants, options and target; two
    threads compiling one specialization at once each make an object of it)."""
    if a is b:
        return True
    ha, hb = getattr(a, "hash", None), getattr(b, "hash", None)
    return isinstance(ha, str) and bool(ha) and ha == hb


def warm_cache_key() -> None:
    """Compute Triton's own key (a hash over its installed sources and libraries, about
    0.4 s on an H200 host, computed once per process) so that the first compile does not
    wait for it. Nothing where the installed Triton has no such function."""
    from triton.runtime import cache

    key = getattr(cache, "triton_key", None)
    if callable(key):
        key()


def out_of_resources() -> type[Exception]:
    """Triton's exception for a config the device cannot run (shared memory, registers)."""
    from triton.runtime.errors import OutOfResources

    found: type[Exception] = OutOfResources
    return found


def allocator_state() -> tuple[Any, Any]:
    """Triton's allocator context variable and its null allocator's type (None where
    the installed Triton has neither)."""
    from triton.runtime import _allocation

    return getattr(_allocation, "_allocator", None), getattr(_allocation, "NullAllocator", None)


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
