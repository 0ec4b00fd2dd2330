"""Build gemsops' native replay library (``native.cpp``) with the host C++ compiler.

One shared library per (source, torch build, compiler), kept under the cache
directory (``$XDG_CACHE_HOME/gemsops/native`` or ``~/.cache/gemsops/native``), so a
process after the first loads it in milliseconds. The build needs only a C++20
compiler and torch's headers (no CUDA toolkit, no ninja): the CUDA driver and torch's
stream are looked up when the library first launches.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

__all__ = ["BuildError", "build", "cache_dir", "library_path"]

SOURCE = Path(__file__).with_name("native.cpp")


class BuildError(RuntimeError):
    """The native library could not be built; the message says why (and gives the
    compiler's output)."""


def cache_dir() -> Path:
    """Where built libraries are kept."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gemsops" / "native"


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _torch_dirs() -> tuple[list[str], str]:
    from torch.utils import cpp_extension

    include = [str(p) for p in cpp_extension.include_paths()]
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    return include, lib


def _flags(compiler: str) -> list[str]:
    include, lib = _torch_dirs()
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return [
        compiler, "-O2", "-std=c++20", "-shared", "-fPIC", "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        *(f"-I{p}" for p in include),
        str(SOURCE),
        f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{lib}", "-ldl",
    ]


def library_path() -> Path | None:
    """The library this torch build and source would load (built or not); None without
    a C++ compiler."""
    compiler = _compiler()
    if compiler is None:
        return None
    digest = hashlib.sha256()
    digest.update(SOURCE.read_bytes())
    digest.update(" ".join(_flags(compiler)).encode())
    digest.update(torch.__version__.encode())
    digest.update(str(Path(torch.__file__).resolve()).encode())
    return cache_dir() / f"gemsops_native-{digest.hexdigest()[:16]}.so"


def build(*, quiet: bool = False) -> Path:
    """The library's path, compiling it first when it is not built yet.

    Raises:
        BuildError: no C++ compiler, or the compile failed.
    """
    path = library_path()
    if path is None:
        raise BuildError("no C++ compiler found (tried $CXX, c++, g++, clang++)")
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler = _compiler()
    assert compiler is not None
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    cmd = [*_flags(compiler), "-o", tmp]
    started = time.perf_counter()
    if not quiet:
        print("gemsops: building the native replay library (once per torch install)...",
              file=sys.stderr, flush=True)
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        os.unlink(tmp)
        raise BuildError(f"the compiler did not run: {error}") from error
    if done.returncode != 0:
        os.unlink(tmp)
        raise BuildError(f"{compiler} failed (rc {done.returncode}):\n{done.stderr[-4000:]}")
    os.replace(tmp, path)  # atomic: a concurrent build of the same library is harmless
    if not quiet:
        print(f"gemsops: built {path.name} in {time.perf_counter() - started:.1f} s",
              file=sys.stderr, flush=True)
    return path
