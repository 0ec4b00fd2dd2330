// gemsops native fast path, prototype: aten::add.Tensor at the CUDA key in C++.
//
// The fast case (two contiguous float32 tensors of one shape on one device, alpha 1,
// fewer than 2^31 elements) allocates the output with at::empty_like and launches a
// Triton kernel compiled once in Python (its CUfunction handle, warps, shared memory and
// parameter count are handed over by gemsops_native::set_add_kernel) with the CUDA
// driver's cuLaunchKernel on the current stream. Every other call goes to torch's own
// add.out kernel. Built and timed by .ci/native/bench_native.py; not part of gemsops.
#include <ATen/core/Tensor.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/result_type.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>
#include <torch/library.h>

#include <cstdint>

namespace {

using Launch = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, void*, void**, void**);

Launch cu_launch = nullptr;
void* function = nullptr;
int64_t threads = 128;
int64_t shared = 0;
int64_t block = 1024;
int64_t params = 4;   // the kernel's parameters as compiled (Triton appends scratch pointers)
int64_t mode = 0;     // 0: launch; 1: allocate only (no launch), to split the cost

void set_add_kernel(int64_t fn, int64_t warps, int64_t shared_bytes, int64_t block_size,
                    int64_t param_count, int64_t run_mode) {
  if (cu_launch == nullptr) {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    TORCH_CHECK(lib != nullptr, "gemsops_native: cannot open libcuda.so.1");
    cu_launch = reinterpret_cast<Launch>(dlsym(lib, "cuLaunchKernel"));
    TORCH_CHECK(cu_launch != nullptr, "gemsops_native: no cuLaunchKernel in libcuda");
  }
  TORCH_CHECK(param_count >= 4 && param_count <= 8, "gemsops_native: unexpected parameter count ",
              param_count);
  function = reinterpret_cast<void*>(fn);
  threads = warps * 32;
  shared = shared_bytes;
  block = block_size;
  params = param_count;
  mode = run_mode;
}

at::Tensor add(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  const bool fast = function != nullptr && a.scalar_type() == at::kFloat &&
                    b.scalar_type() == at::kFloat && a.sizes().equals(b.sizes()) &&
                    a.is_contiguous() && b.is_contiguous() && a.device() == b.device() &&
                    a.numel() < (int64_t(1) << 31) && a.numel() > 0 &&
                    a.numel() % 16 == 0 && !alpha.isComplex() && alpha.toDouble() == 1.0 &&
                    // the specialization compiled: 16-byte aligned pointers, n % 16 == 0
                    (reinterpret_cast<uintptr_t>(a.data_ptr()) & 15) == 0 &&
                    (reinterpret_cast<uintptr_t>(b.data_ptr()) & 15) == 0;
  if (!fast) {
    at::Tensor out = at::empty({0}, a.options().dtype(at::result_type(a, b)));
    return at::add_out(out, a, b, alpha);  // torch's own kernel (add.out) sizes it
  }
  at::Tensor out = at::empty_like(a);
  if (mode == 1) {
    return out;
  }
  void* pa = a.data_ptr();
  void* pb = b.data_ptr();
  void* po = out.data_ptr();
  int32_t n = static_cast<int32_t>(a.numel());
  void* scratch0 = nullptr;
  void* scratch1 = nullptr;
  void* scratch2 = nullptr;
  void* scratch3 = nullptr;
  void* args[8] = {&pa, &pb, &po, &n, &scratch0, &scratch1, &scratch2, &scratch3};
  void* stream = c10::cuda::getCurrentCUDAStream(a.device().index()).stream();
  unsigned grid = static_cast<unsigned>((n + block - 1) / block);
  int rc = cu_launch(function, grid, 1, 1, static_cast<unsigned>(threads), 1, 1,
                     static_cast<unsigned>(shared), stream, args, nullptr);
  TORCH_CHECK(rc == 0, "gemsops_native: cuLaunchKernel failed with CUresult ", rc);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gemsops_native, m) {
  m.def("set_add_kernel(int fn, int warps, int shared, int block, int params, int mode) -> ()",
        &set_add_kernel);
}

TORCH_LIBRARY_IMPL(aten, CUDA, m) { m.impl("add.Tensor", &add); }
