"""Whether Triton compiles in parallel on threads: four matmul configs for an sm90 target,
compiled on one thread, then (in a fresh Triton cache) on N threads. Runs without a GPU
(Triton's wheel carries ptxas).

    TRITON_CACHE_DIR=$(mktemp -d) python .ci/compile_threads.py 1
    TRITON_CACHE_DIR=$(mktemp -d) python .ci/compile_threads.py 2
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def mm(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
        y = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16))


def compile_one(cfg: tuple[int, int, int]) -> None:
    bm, bn, bk = cfg
    signature = {"a": "*bf16", "b": "*bf16", "c": "*bf16", "M": "i32", "N": "i32", "K": "i32",
                 "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}
    src = ASTSource(mm, signature, {"BM": bm, "BN": bn, "BK": bk})
    triton.compile(src, target=GPUTarget("cuda", 90, 32),
                   options={"num_stages": 3, "num_warps": 4})


def main() -> None:
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    compile_one((32, 32, 32))  # imports and the first compile's set-up, untimed
    configs = [(64, 64, 32), (128, 64, 32), (64, 128, 32), (128, 128, 32)]
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(compile_one, configs))
    print(f"{len(configs)} configs on {threads} thread(s): {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
