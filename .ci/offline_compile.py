"""Compile this session's new Triton kernels for an NVIDIA sm_90 target, offline (no GPU).

    .venv/bin/python .ci/offline_compile.py [--family math,sort,...] [--arch 90] [--keep-cache]

Kernels that have only run on the Triton interpreter can still fail to compile for a
GPU (``tl.where`` on mismatched dtypes, float64 intrinsics, 0-d loop-carried values...).
This script finds such failures without a device: it installs a stand-in NVIDIA device of
compute capability ``--arch`` on torch's ``meta`` device type (so gemshal does not switch
the interpreter on, kernel modules build real ``JITFunction`` objects and tuning reads the
sm_90 tables), runs each family's host functions on meta tensors with
``JITFunction.run`` replaced by a recorder (no launch, no driver), and compiles every
recorded launch (its arguments, constexprs and the tuned config's ``num_warps`` /
``num_stages``) with ``triton.compile`` for ``GPUTarget("cuda", arch, 32)``, through
PTX to a cubin with the bundled ptxas.

Prints one line per distinct variant (``ok`` or the first line of the error), a count
per family, and exits 1 when any variant failed to compile (a host call that fails
before any launch is a ``host`` line, counted as a failure too; a call the host refuses
on purpose, ``Unsupported``, is a ``skip`` line). Not a test: CI need not have Triton's
CUDA backend.

Families: matmul (a language-model head's products, aligned or not), attention (forward and backward: causal or not, an additive bias or a boolean
mask, dropout, GQA, one query row, SDPA's transposed layout, bf16 and fp32), embedding
(the backward's one-segment and long-run launches), dropout, math, rounding, binary_math,
activation_extra (the flat pointwise template with OP = each element function,
float32 / bfloat16 / float64 and integer inputs where the record takes them), spread
(vector norms), sort, put, isin, fill, sample, optim (fused AdamW and SGD, a foreach
lerp).
Not covered: the strided pointwise template (``_tiled_kernel``) and configs other than
the one the sm_90 tuning entry launches for these small shapes.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)
os.environ["GEMS_LAUNCH"] = "jit"  # no direct launcher: it would ask a driver for a stream
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

Case = tuple[str, Callable[[], Any]]


_KEEP: list[Any] = []


def _install_device(arch: int) -> None:
    """A stand-in NVIDIA device of capability ``arch`` on torch's meta device type."""
    import attrs

    from gemshal import device as _device
    from gemshal.detect import Detection, TraceStep
    from gemshal.registry import vendor
    from gemshal.testing import FakeDeviceModule, FakeProperties

    class _Module(FakeDeviceModule):
        def get_device_properties(self, index: int) -> FakeProperties:
            return FakeProperties(name=f"offline sm_{arch}", major=arch // 10, minor=arch % 10)

    info = attrs.evolve(vendor("nvidia"), device_type="meta", dispatch_key="Meta")
    step = TraceStep("explicit", "chosen", ".ci/offline_compile.py", "nvidia")
    scope = _device.installed(Detection(info, "explicit", (step,)), _Module(count=1))
    scope.__enter__()
    _KEEP.append(scope)  # a dropped generator would be closed, restoring the old device
    dev = _device.current_device()
    if dev.interpreter:
        raise SystemExit("offline_compile: the stand-in device runs on the interpreter")


def _distinct_meta_storages() -> None:
    """Meta storages all report data_ptr 0, which the hosts' aliasing checks (``self shares
    storage with an input``) read as one storage: report each storage's own handle."""
    import torch

    plain = torch.UntypedStorage.data_ptr

    def data_ptr(self: Any) -> int:
        return int(self._cdata) if self.device.type == "meta" else int(plain(self))

    torch.UntypedStorage.data_ptr = data_ptr  # type: ignore[method-assign]


RECORDED: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []


def _patch_run() -> None:
    from triton.runtime.jit import JITFunction

    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        RECORDED.append((self, args, dict(kwargs)))

    JITFunction.run = run


# --- the cases ----------------------------------------------------------------------------


def _t(*shape: int, dtype: Any = None) -> Any:
    import torch

    return torch.empty(shape, dtype=dtype or torch.float32, device="meta")


def _pointwise_cases(module_name: str) -> list[Case]:
    import importlib

    import torch

    from gemsops.ops.pointwise.iterator import run
    from gemsops.ops.pointwise.types import PointwiseOp
    from gemsops.ops.pointwise.types import Promotion as P

    module = importlib.import_module(f"gemsops.ops.pointwise.{module_name}")
    records: list[PointwiseOp] = []

    def collect(value: Any) -> None:
        if isinstance(value, PointwiseOp):
            if all(value is not r for r in records):
                records.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                collect(v)
        elif isinstance(value, tuple | list):
            for v in value:
                collect(v)

    for name, value in vars(module).items():
        if not name.startswith("__"):
            collect(value)
    # Records whose body lives in this module (not one imported from another family).
    records = [r for r in records if getattr(r.body, "fn", r.body).__module__ == module.__name__]
    float32_only = {"erfc", "erfinv"}  # their host functions hand float64 to torch
    cases: list[Case] = []
    for record in records:
        dtypes = [torch.float32, torch.bfloat16, torch.float64]
        if record.promotion is P.INT_TO_FLOAT or torch.int32 in record.dtypes:
            dtypes += [torch.int32, torch.int64]
        if torch.bool in record.dtypes and record.promotion is P.ALWAYS_BOOL:
            dtypes.append(torch.bool)
        for dtype in dtypes:
            if record.name in float32_only and dtype == torch.float64:
                continue
            scalar = 3 if not dtype.is_floating_point else 0.5
            operands = [_t(1000, dtype=dtype) if r == "p" else 0.5 for r in record.roles]
            label = f"{record.name}({getattr(record.body, '__name__', '?')}) {dtype}"
            cases.append((label, _bind(run, record, operands)))
            if record.roles == "pp" and dtype in (torch.float32, torch.int32):
                cases.append((label + " tensor-scalar",
                              _bind(run, record, [operands[0], scalar])))
    return cases


def _bind(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[], Any]:
    return lambda: fn(*args, **kwargs)


def _spread_cases() -> list[Case]:
    import torch

    from gemsops.ops.rowwise import spread

    cases: list[Case] = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        for ord_ in (2, 1, math.inf, -math.inf, 0, 3.0, -1.5):
            cases.append((f"vector_norm ord={ord_} rows {dtype}",
                          _bind(spread.linalg_vector_norm, _t(8, 300, dtype=dtype), ord_, -1)))
            cases.append((f"vector_norm ord={ord_} mid {dtype}",
                          _bind(spread.linalg_vector_norm, _t(4, 300, 5, dtype=dtype), ord_, 1)))
        cases.append((f"vector_norm all {dtype}",
                      _bind(spread.linalg_vector_norm, _t(64, 33, dtype=dtype))))
        cases.append((f"norm p=2 dim=-1 {dtype}", _bind(spread.norm, _t(8, 300, dtype=dtype), 2,
                                                        [-1])))
        cases.append((f"var dim=-1 {dtype}", _bind(spread.var, _t(8, 300, dtype=dtype), -1)))
        cases.append((f"std_mean dim=1 {dtype}",
                      _bind(spread.std_mean, _t(4, 300, 5, dtype=dtype), 1)))
    cases.append(("vector_norm f32 dtype=float64",
                  _bind(spread.linalg_vector_norm, _t(8, 300), 2, -1, dtype=torch.float64)))
    return cases


def _sort_cases() -> list[Case]:
    import torch

    from gemsops.ops.index import sort

    cases: list[Case] = []
    dtypes = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32,
              torch.int64, torch.int16, torch.int8, torch.uint8, torch.bool)
    for dtype in dtypes:
        for descending in (False, True):
            cases.append((f"sort {dtype} desc={descending} rows 100",
                          _bind(sort.sort, _t(4, 100, dtype=dtype), -1, descending)))
        cases.append((f"sort {dtype} dim=1 of 3-d, 1500",
                      _bind(sort.sort, _t(2, 1500, 3, dtype=dtype), 1, False)))
        cases.append((f"sort {dtype} rows 7", _bind(sort.sort, _t(64, 7, dtype=dtype), -1)))
    return cases


def _put_cases() -> list[Case]:
    import torch

    from gemsops.ops.index import put

    cases: list[Case] = []
    for dtype in (torch.float32, torch.bfloat16, torch.float64, torch.int32, torch.int64):
        for accumulate in (False, True):
            for idt in (torch.int64, torch.int32):
                cases.append((f"index_put {dtype} acc={accumulate} idx {idt}", _bind(
                    put.index_put, _t(10, 20, dtype=dtype), [_t(5, dtype=idt)],
                    _t(5, 20, dtype=dtype), accumulate)))
            cases.append((f"index_put {dtype} acc={accumulate} two indices", _bind(
                put.index_put, _t(10, 20, dtype=dtype), [_t(5, dtype=torch.int64),
                                                         _t(5, dtype=torch.int64)],
                _t(5, dtype=dtype), accumulate)))
        cases.append((f"masked_scatter {dtype}", _bind(
            put.masked_scatter, _t(10, 20, dtype=dtype), _t(10, 20, dtype=torch.bool),
            _t(200, dtype=dtype))))
    return cases


def _isin_cases() -> list[Case]:
    import torch

    from gemsops.ops.index import isin

    cases: list[Case] = []
    for dtype in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.float32,
                  torch.bfloat16, torch.float64, torch.bool):
        for invert in (False, True):
            cases.append((f"isin {dtype} invert={invert}", _bind(
                isin.isin, _t(100, dtype=dtype), _t(7, dtype=dtype), invert=invert)))
        cases.append((f"isin {dtype} scalar test", _bind(isin.isin, _t(100, dtype=dtype), 1)))
        cases.append((f"isin scalar in {dtype}", _bind(isin.isin, 1, _t(7, dtype=dtype))))
    cases.append(("isin int32 in int64", _bind(isin.isin, _t(100, dtype=torch.int32),
                                               _t(7, dtype=torch.int64))))
    return cases


def _fill_cases() -> list[Case]:
    import torch

    from gemsops.ops.random import fill

    cases: list[Case] = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        cases.append((f"uniform_ {dtype}", _bind(fill.uniform_, _t(1000, dtype=dtype), -1.0, 2.0)))
        cases.append((f"normal_ {dtype}", _bind(fill.normal_, _t(1000, dtype=dtype), 0.0, 1.0)))
        cases.append((f"exponential_ {dtype}",
                      _bind(fill.exponential_, _t(1000, dtype=dtype), 1.5)))
    for dtype in (torch.float32, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
                  torch.int16, torch.int32, torch.int64, torch.bool):
        cases.append((f"random_ {dtype}", _bind(fill.random_, _t(1000, dtype=dtype))))
        cases.append((f"random_ {dtype} 0..2", _bind(fill.random_, _t(1000, dtype=dtype), 0, 2)))
    cases.append(("random_ int64 full range",
                  _bind(fill.random_, _t(1000, dtype=torch.int64), -(2**63))))
    cases.append(("uniform_ non-dense", _bind(fill.uniform_, _t(20, 30).t())))
    return cases


def _sample_cases() -> list[Case]:
    import torch

    from gemsops.ops.random import sample

    cases: list[Case] = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        cases.append((f"multinomial {dtype} replacement",
                      _bind(sample.multinomial, _t(4, 50, dtype=dtype), 8, True)))
        cases.append((f"multinomial {dtype} 1 sample",
                      _bind(sample.multinomial, _t(50, dtype=dtype), 1)))
        cases.append((f"multinomial {dtype} without replacement",
                      _bind(sample.multinomial, _t(4, 50, dtype=dtype), 5, False)))
        cases.append((f"multinomial {dtype} many categories",
                      _bind(sample.multinomial, _t(2, 5000, dtype=dtype), 300, True)))
    return cases


def _optim_cases() -> list[Case]:
    import torch

    from gemsops.ops.optim import foreach, fused

    def lists(n: int, dtype: Any) -> list[Any]:
        return [_t(5000 + 300 * i, dtype=dtype) for i in range(n)]

    cases: list[Case] = []
    for dtype in (torch.bfloat16, torch.float32):
        p, g, m, v = (lists(3, dtype) for _ in range(4))
        steps = [_t(1) for _ in range(3)]
        for amsgrad in (False, True):
            cases.append((f"fused adamw {dtype} amsgrad={amsgrad}", _bind(
                fused.fused_adamw, p, g, m, v, lists(3, dtype) if amsgrad else [], steps,
                lr=1e-3, beta1=0.9,
                beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=amsgrad, maximize=False)))
        cases.append((f"fused sgd {dtype}", _bind(
            fused.fused_sgd, p, g, lists(3, dtype), weight_decay=0.0, momentum=0.9, lr=1e-2,
            dampening=0.0, nesterov=False, maximize=False, is_first_step=False)))
        cases.append((f"foreach lerp_ {dtype}", _bind(foreach.foreach_lerp_scalar, p, g, 0.1)))
    return cases


def _attention_cases() -> list[Case]:
    import torch

    from gemsops.ops.attention import sdpa
    from gemsops.ops.attention.dropout import draw

    def heads(b: int, h: int, length: int, d: int, dtype: Any, blhd: bool) -> Any:
        if blhd:  # [B, L, H, D] memory seen as [B, H, L, D], as HF models hand it over
            return _t(b, length, h, d, dtype=dtype).transpose(1, 2)
        return _t(b, h, length, d, dtype=dtype)

    def forward_backward(b: int, hq: int, hkv: int, lq: int, lk: int, d: int, dtype: Any,
                         causal: bool, bias: Any, p: float, blhd: bool) -> None:
        q = heads(b, hq, lq, d, dtype, blhd)
        k, v = heads(b, hkv, lk, d, dtype, blhd), heads(b, hkv, lk, d, dtype, blhd)
        if bias == "bool":  # a boolean padding mask, read by the kernels as stored
            mask = _t(b, 1, 1, lk, dtype=torch.bool).expand(b, hq, lq, lk)
        else:
            mask = _t(b, 1, lq, lk, dtype=dtype) if bias else None
        out = torch.empty_like(q)
        lse = _t(b, hq, lq)
        drop = draw(p, q.device)[1] if p else None
        sdpa._forward(q, k, v, mask, causal, d ** -0.5, out, lse, drop)
        sdpa._backward(torch.empty_like(out), q, k, v, mask, out, lse, causal, d ** -0.5,
                       bias_grad=bias is True, drop=drop)

    cases: list[Case] = []
    for dtype in (torch.bfloat16, torch.float32):
        for causal in (False, True):
            for bias, p in ((False, 0.0), (True, 0.0), (False, 0.1), ("bool", 0.0),
                            ("bool", 0.1)):
                if causal and bias:
                    continue
                for b, hq, hkv, lq, lk, d, blhd in ((2, 8, 8, 512, 512, 64, True),
                                                    (1, 8, 2, 300, 300, 128, False),
                                                    (1, 4, 4, 1, 64, 128, True)):
                    label = (f"attention {dtype} {b}x{hq}/{hkv}x{lq}x{lk}x{d} causal={causal}"
                             f" bias={bias} p={p} {'blhd' if blhd else 'bhld'}")
                    cases.append((label, _bind(forward_backward, b, hq, hkv, lq, lk, d,
                                               dtype, causal, bias, p, blhd)))
    return cases


def _embedding_cases() -> list[Case]:
    """The embedding backward: one segment (no run crosses one) and a long run of one
    index over many segments (BERT's token types), with and without scale_grad_by_freq."""
    import torch

    from gemsops.ops.memory import embedding

    cases: list[Case] = []
    for dtype in (torch.bfloat16, torch.float32):
        for n, num in ((40, 30522), (2048, 2)):
            for scale in (False, True):
                g = _t(n, 768, dtype=dtype)
                idx = _t(n, dtype=torch.int64)
                cases.append((f"embedding_dense_backward {dtype} {n} of {num} scale={scale}",
                              _bind(embedding.embedding_dense_backward, g, idx, num, -1,
                                    scale)))
    return cases


def _dropout_cases() -> list[Case]:
    import torch

    from gemsops.ops.random import dropout

    cases: list[Case] = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = _t(5000, dtype=dtype)
        cases.append((f"native_dropout {dtype}", _bind(dropout.native_dropout, x, 0.1, True)))
        cases.append((f"native_dropout_backward {dtype}", _bind(
            dropout.native_dropout_backward, x, _t(5000, dtype=torch.bool), 1.25)))
        cases.append((f"bernoulli {dtype}", _bind(dropout.bernoulli, x, 0.3)))
    return cases


def _reduce_cases() -> list[Case]:
    """The small Llama step's reductions (RMSNorm's mean and its backward's sums)."""
    import torch

    from gemsops.ops.rowwise import value

    x = _t(4, 512, 1024)
    g = _t(4, 512, 1024, dtype=torch.bfloat16)
    mask = _t(4, 512, dtype=torch.bool)
    return [
        ("sum(-1) f32 4x512x1024", _bind(value.reduce, x, (2,), True, value.SUM, torch.float32)),
        ("mean(-1) f32 4x512x1024", _bind(value.reduce, x, (2,), True, value.SUM,
                                          torch.float32, count=1024)),
        ("sum((0,1)) bf16 4x512x1024", _bind(value.reduce, g, (0, 1), False, value.SUM,
                                             torch.bfloat16)),
        ("sum() bool 4x512", _bind(value.reduce, mask, (0, 1), False, value.SUM, torch.int64)),
    ]


def _matmul_cases() -> list[Case]:
    """A language-model head's three products (forward, input and weight gradients) at
    BERT's and GPT-2's vocabularies, whose 30522 and 50257 columns are not 16-byte
    aligned (the portable kernel's route, and with ``POINTER_OPERANDS`` the persistent
    kernel reading or writing that matrix through pointers), and at Llama's aligned
    128256; then ViT-B/16's attention products at 32 images (bmm over 384 heads of 197
    tokens by 64, rows not 16-byte aligned either)."""
    import torch

    from gemsops.ops import replay
    from gemsops.ops.matmul import mm as MM
    from gemsops.ops.matmul import persistent

    def product(a: Any, b: Any, pointers: bool) -> None:
        persistent.POINTER_OPERANDS = pointers  # the route a GPU run has not yet timed
        replay.clear()  # the replay memo would launch the route it saw first
        try:
            MM.bmm(a, b) if a.dim() == 3 else MM.mm(a, b)
        finally:
            persistent.POINTER_OPERANDS = False

    cases: list[Case] = []
    bf16 = torch.bfloat16
    for vocab in (30522, 50257, 128256):
        t, h = 2048, 768
        x, w = _t(t, h, dtype=bf16), _t(vocab, h, dtype=bf16)
        dy = _t(t, vocab, dtype=bf16)
        for pointers in (False, True) if vocab % 8 else (False,):
            how = " pointers" if pointers else ""
            cases.append((f"head fwd {t}x{vocab}x{h}{how}", _bind(product, x, w.t(), pointers)))
            cases.append((f"head dx {t}x{h}x{vocab}{how}", _bind(product, dy, w, pointers)))
            cases.append((f"head dw {vocab}x{h}x{t}{how}", _bind(product, dy.t(), x, pointers)))
    q, k, p = _t(384, 197, 64, dtype=bf16), _t(384, 197, 64, dtype=bf16), _t(384, 197, 197, dtype=bf16)
    for pointers in (False, True):
        how = " pointers" if pointers else ""
        cases.append((f"vit scores 384x197x197x64{how}", _bind(product, q, k.transpose(1, 2), pointers)))
        cases.append((f"vit p@v 384x197x64x197{how}", _bind(product, p, k, pointers)))
        cases.append((f"vit dv 384x197x64x197{how}", _bind(product, p.transpose(1, 2), q, pointers)))
    return cases


FAMILIES: dict[str, Callable[[], list[Case]]] = {
    "matmul": _matmul_cases,
    "reduce": _reduce_cases,
    "attention": _attention_cases,
    "embedding": _embedding_cases,
    "dropout": _dropout_cases,
    "math": lambda: _pointwise_cases("math"),
    "rounding": lambda: _pointwise_cases("rounding"),
    "binary_math": lambda: _pointwise_cases("binary_math"),
    "activation_extra": lambda: _pointwise_cases("activation_extra"),
    "spread": _spread_cases,
    "sort": _sort_cases,
    "put": _put_cases,
    "isin": _isin_cases,
    "fill": _fill_cases,
    "sample": _sample_cases,
    "optim": _optim_cases,
}


# --- compiling ----------------------------------------------------------------------------


def _short(value: Any) -> str:
    name = getattr(value, "__name__", None)
    if name is not None and callable(value):
        return str(name)
    return str(value)


def _describe(jit: Any, signature: dict[str, Any], constexprs: dict[Any, Any]) -> str:
    names = [p.name for p in jit.params]
    ptrs = ",".join(f"{k}:{v}" for k, v in signature.items() if str(v).startswith("*"))
    consts = []
    for path, value in constexprs.items():
        name = names[path[0]] if isinstance(path, tuple) and len(path) == 1 else str(path)
        if value is None or name in ("SIZE_CLASS",):
            continue
        consts.append(f"{name}={_short(value)}")
    return f"{jit.__name__}({ptrs}) {' '.join(consts)}"


class Compiler:
    """Compile recorded launches of JIT functions for one CUDA target."""

    def __init__(self, arch: int, ptx: str = "") -> None:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend

        self.ptx = ptx
        """A folder for each variant's PTX ('' keeps none)."""
        self.target = GPUTarget("cuda", arch, 32)
        self.backend = make_backend(self.target)
        self.binders: dict[int, Any] = {}
        self.seen: set[str] = set()

    def compile(self, jit: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> tuple[str, str] | None:
        """(description, "ok" or the error's first line); None for a variant already seen."""
        import triton
        from triton import knobs
        from triton.compiler import ASTSource
        from triton.runtime.jit import create_function_from_signature

        binder = self.binders.get(id(jit))
        if binder is None:
            binder = self.binders[id(jit)] = create_function_from_signature(
                jit.signature, jit.params, self.backend)
        kw = dict(kwargs)
        kw.setdefault("debug", False)
        kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        kw["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
        bound, spec, options = binder(*args, **kw)
        options, signature, constexprs, attrs = jit._pack_args(self.backend, kw, bound, spec,
                                                               options)
        what = _describe(jit, signature, constexprs)
        key = f"{jit.__module__}.{jit.__name__}|{signature}|{constexprs}|{attrs}|{options}"
        if key in self.seen:
            return None
        self.seen.add(key)
        extra = f" w{options.num_warps}s{options.num_stages}"
        try:
            compiled = triton.compile(ASTSource(jit, signature, constexprs, attrs),
                                      target=self.target, options=options.__dict__)
            if not compiled.asm.get("cubin"):
                return what + extra, "FAIL: no cubin"
            if self.ptx:
                name = f"{jit.__name__}-{len(self.seen)}.ptx"
                with open(os.path.join(self.ptx, name), "w") as f:
                    f.write(f"// {what}{extra}\n{compiled.asm['ptx']}")
        except Exception as exc:  # the compile error is what this script reports
            text = str(exc).strip().splitlines()
            first = next((line for line in text if line.strip()), type(exc).__name__)
            # Triton's CompilationError puts the source position first: keep the message.
            detail = [line for line in text if "Error" in line or "error" in line]
            if detail and detail[0] != first:
                first = f"{first} | {detail[0].strip()}"
            return what + extra, f"FAIL: {type(exc).__name__}: {first}"
        return what + extra, "ok"


def _every_config(jit: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                  ) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """The recorded launch once per config of its gemshal kernel's tuning entry (the
    launch alone for a kernel without one)."""
    from gemshal.kernel.decorator import _KERNELS

    owner = next((k for k in list(_KERNELS) if k.fn is jit), None)
    if owner is None:
        return [(jit, args, kwargs)]
    out = []
    for config in owner.configs_for_current_device():
        kw = dict(kwargs)
        kw.update(config.to_triton().all_kwargs())
        out.append((jit, args, kw))
    return out or [(jit, args, kwargs)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default=",".join(FAMILIES),
                        help="comma-separated families (default: all)")
    parser.add_argument("--arch", type=int, default=90, help="CUDA capability, e.g. 90")
    parser.add_argument("--keep-cache", action="store_true",
                        help="use Triton's cache dir (default: a fresh one, so all compile)")
    parser.add_argument("--traceback", action="store_true", help="print full tracebacks")
    parser.add_argument("--match", default="",
                        help="only the cases whose label contains this text")
    parser.add_argument("--all-configs", action="store_true",
                        help="compile every config of each launched kernel's tuning entry, "
                             "not only the one the launch chose")
    parser.add_argument("--ptx", default="",
                        help="write each variant's PTX into this folder (to read its loads)")
    ns = parser.parse_args(argv)
    if ns.ptx:
        os.makedirs(ns.ptx, exist_ok=True)
    if not ns.keep_cache:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="offline-compile-")
    families = [f.strip() for f in ns.family.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {', '.join(FAMILIES)}")

    _install_device(ns.arch)
    _patch_run()
    _distinct_meta_storages()
    from gemshal.kernel.compile import waiting
    from gemsops.errors import Unsupported

    compiler = Compiler(ns.arch, ns.ptx)
    failed = 0
    summary: list[str] = []
    start = time.perf_counter()
    for family in families:
        ok = bad = skipped = 0
        began = time.perf_counter()
        for label, call in FAMILIES[family]():
            if ns.match not in label:
                continue
            RECORDED.clear()
            try:
                with waiting():
                    call()
            except Unsupported as exc:
                print(f"{family:16} skip  {label}: Unsupported: {exc}")
                skipped += 1
                continue
            except Exception as exc:
                if not RECORDED:
                    print(f"{family:16} host  {label}: {type(exc).__name__}: {exc}")
                    if ns.traceback:
                        traceback.print_exc()
                    bad += 1
                    continue
                # Launches recorded before the failure (the host read a meta value): compile
                # them, and say so.
                print(f"{family:16} note  {label}: host stopped after {len(RECORDED)} "
                      f"launch(es): {type(exc).__name__}: {exc}")
            launches = list(RECORDED)
            if ns.all_configs:
                launches = [v for launch in launches for v in _every_config(*launch)]
            for jit, args, kwargs in launches:
                try:
                    result = compiler.compile(jit, args, kwargs)
                except Exception as exc:
                    result = (f"{getattr(jit, '__name__', jit)} [{label}]",
                              f"FAIL: binding: {type(exc).__name__}: {exc}")
                if result is None:
                    continue
                what, status = result
                print(f"{family:16} {status.split(':')[0]:4}  {what}  [{label}]"
                      + (f"\n{'':22}{status}" if status != "ok" else ""), flush=True)
                if status == "ok":
                    ok += 1
                else:
                    bad += 1
        failed += bad
        summary.append(f"{family}: {ok} ok, {bad} failed, {skipped} skipped "
                       f"({time.perf_counter() - began:.0f} s)")
    print(f"--- sm_{ns.arch}, {time.perf_counter() - start:.0f} s")
    for line in summary:
        print(line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
