// gemsops native replay: a C++ kernel at the backend dispatch key for each served aten
// overload. It keys a call on its arguments' structure (per tensor: dtype, device, sizes,
// strides, 16-byte alignment and which earlier argument shares its storage; per number,
// string or list: its value). A key with a recipe allocates the outputs and launches the
// recorded Triton kernels straight through the CUDA driver, without entering Python. Any
// other call goes to gemsops' Python kernel, registered one level down at PrivateUse3
// (which records the call and may hand a recipe back through gemsops_native::offer) or
// PrivateUse2 (which only runs it). Python keeps every decision: a recipe is what the
// Python path did for that structure, flattened to integers (see gemsops/native/recipe.py).
//
// Built by gemsops/native/build.py with the host compiler and torch's headers only: the
// CUDA driver (cuLaunchKernel) and torch's current stream are looked up with dlsym on
// first use, so one build serves CPU-only machines (where launches are logged, for tests)
// and GPUs.
#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// --- recipes ---------------------------------------------------------------------------

enum SlotKind : int64_t {
  kConst = 0,    // a = the value's bits (the kernel reads 1, 2, 4 or 8 bytes of it)
  kInput = 1,    // a = flat input tensor index, b = byte offset from its data pointer
  kOutput = 2,   // a = output index, b = byte offset
  kWork = 3,     // a = workspace index, b = byte offset
  kScratch = 4,  // Triton's global scratch for this launch (launch.scratch bytes)
  kNull = 5,     // a null pointer (profile scratch, a None pointer argument)
};

struct Slot {
  int64_t kind, a, b;
};

struct Launch {
  int64_t function, gx, gy, gz, threads, shared, scratch;
  std::vector<Slot> slots;
};

struct Alloc {
  c10::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
};

struct Recipe {
  bool refused = false;
  int64_t device = -1;  // the device index launches run on (-1: the CPU, logged only)
  std::vector<Alloc> outputs, works;
  std::vector<Launch> launches;
  // (kind, value): 0 an output, 1 an input tensor, 2 an int, 3 an undefined tensor,
  // 4 None, 5 a bool, 6 a double's bits
  std::vector<std::pair<int64_t, int64_t>> results;
};

struct VecHash {
  size_t operator()(const std::vector<int64_t>& v) const noexcept {
    uint64_t h = 1469598103934665603ULL ^ v.size();
    for (int64_t x : v) {
      h ^= static_cast<uint64_t>(x) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

using Key = std::vector<int64_t>;

// --- process state -----------------------------------------------------------------------

std::atomic<int64_t> g_mode{0};  // 0: launch through the driver; 1: log launches only
std::atomic<int64_t> g_epoch{0}; // bumped by clear(): recipes of an older epoch are dropped
std::mutex g_log_mutex;
std::vector<int64_t> g_log;     // mode 1: per launch [function, gx, gy, gz, threads, shared, n, params...]
const size_t kLogLimit = 1 << 20;
const size_t kTableLimit = 8192;

struct Counts {
  std::atomic<int64_t> hits{0}, misses{0}, unkeyed{0}, refused{0}, offered{0}, nested{0};
};

class NativeOp;

struct Pending {
  NativeOp* op;
  Key key;
};

thread_local std::vector<Pending> t_pending;
thread_local int t_depth = 0;

using CuLaunch = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void*, void**, void**);
using StreamOf = void* (*)(const void*);

CuLaunch g_cu_launch = nullptr;
StreamOf g_stream_of = nullptr;
std::once_flag g_driver_once;

void load_driver() {
  std::call_once(g_driver_once, [] {
    void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (cuda != nullptr) {
      g_cu_launch = reinterpret_cast<CuLaunch>(dlsym(cuda, "cuLaunchKernel"));
    }
    // c10::cuda::CUDAStream::stream() const: a CUDAStream is laid out as its c10::Stream.
    void* c10_cuda = dlopen("libc10_cuda.so", RTLD_NOW | RTLD_NOLOAD);
    if (c10_cuda == nullptr) {
      c10_cuda = dlopen("libc10_cuda.so", RTLD_NOW | RTLD_GLOBAL);
    }
    if (c10_cuda != nullptr) {
      g_stream_of = reinterpret_cast<StreamOf>(dlsym(c10_cuda, "_ZNK3c104cuda10CUDAStream6streamEv"));
    }
  });
}

// --- keys --------------------------------------------------------------------------------

enum Tag : int64_t {
  kTagNone = 1, kTagInt, kTagDouble, kTagBool, kTagString, kTagInts, kTagTensors, kTagDevice,
  kTagTensor, kTagUndefined, kTagDoubles, kTagBools, kTagScalarTensor,
};

// Appends what the Python path reads of t; false for a tensor it decides on by value (a
// 0-dim CPU tensor is read as a number) or one without strides.
bool key_tensor(const at::Tensor& t, Key& key, std::vector<at::Tensor>& inputs) {
  if (!t.defined()) {
    key.push_back(kTagUndefined);
    return true;
  }
  if (t.layout() != c10::kStrided || t.is_conj() || t.is_neg()) {
    return false;
  }
  const c10::Device device = t.device();
  const int64_t dim = t.dim();
  if (dim == 0 && device.is_cpu()) {
    // Read as a number by the Python path (baked into the launch): keyed by value.
    const c10::ScalarType st = t.scalar_type();
    int64_t bits;
    if (c10::isFloatingType(st)) {
      const double d = t.item<double>();
      std::memcpy(&bits, &d, sizeof bits);
    } else if (c10::isIntegralType(st, /*includeBool=*/true)) {
      bits = t.item<int64_t>();
    } else {
      return false;
    }
    key.push_back(kTagScalarTensor);
    key.push_back(static_cast<int64_t>(st));
    key.push_back(bits);
    inputs.push_back(t);
    return true;
  }
  key.push_back(kTagTensor);
  key.push_back(static_cast<int64_t>(t.scalar_type()) |
                (static_cast<int64_t>(device.type()) << 8) |
                (static_cast<int64_t>(device.index() + 1) << 16) | (dim << 32));
  for (int64_t s : t.sizes()) key.push_back(s);
  for (int64_t s : t.strides()) key.push_back(s);
  const auto ptr = reinterpret_cast<uintptr_t>(t.data_ptr());
  // Which earlier tensor argument shares the storage, and at what byte distance: the
  // Python path's overlap checks and pointer arithmetic follow from it.
  int64_t shares = -1, delta = 0;
  if (t.has_storage()) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor& o = inputs[i];
      if (o.defined() && o.has_storage() && o.storage().is_alias_of(t.storage())) {
        shares = static_cast<int64_t>(i);
        delta = static_cast<int64_t>(ptr - reinterpret_cast<uintptr_t>(o.data_ptr()));
        break;
      }
    }
  }
  key.push_back(((ptr & 15) == 0 ? 1 : 0) | ((shares + 1) << 1));
  key.push_back(delta);
  inputs.push_back(t);
  return true;
}

bool key_value(const c10::IValue& v, Key& key, std::vector<at::Tensor>& inputs) {
  if (v.isTensor()) return key_tensor(v.toTensor(), key, inputs);
  if (v.isNone()) {
    key.push_back(kTagNone);
  } else if (v.isBool()) {
    key.push_back(kTagBool);
    key.push_back(v.toBool() ? 1 : 0);
  } else if (v.isInt()) {
    key.push_back(kTagInt);
    key.push_back(v.toInt());
  } else if (v.isDouble()) {
    const double d = v.toDouble();
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    key.push_back(kTagDouble);
    key.push_back(bits);
  } else if (v.isString()) {
    const std::string& s = v.toStringRef();
    key.push_back(kTagString);
    key.push_back(static_cast<int64_t>(s.size()));
    key.push_back(static_cast<int64_t>(std::hash<std::string>{}(s)));
  } else if (v.isIntList()) {
    auto list = v.toIntList();
    key.push_back(kTagInts);
    key.push_back(static_cast<int64_t>(list.size()));
    for (int64_t x : list) key.push_back(x);
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    key.push_back(kTagTensors);
    key.push_back(static_cast<int64_t>(list.size()));
    for (const at::Tensor& t : list) {
      if (!t.defined() || !key_tensor(t, key, inputs)) return false;
    }
  } else if (v.isDevice()) {
    const c10::Device d = v.toDevice();
    key.push_back(kTagDevice);
    key.push_back((static_cast<int64_t>(d.type()) << 8) | (d.index() + 1));
  } else if (v.isDoubleList()) {
    auto list = v.toDoubleList();
    key.push_back(kTagDoubles);
    key.push_back(static_cast<int64_t>(list.size()));
    for (double d : list) {
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      key.push_back(bits);
    }
  } else if (v.isBoolList()) {
    auto list = v.toBoolList();
    key.push_back(kTagBools);
    key.push_back(static_cast<int64_t>(list.size()));
    for (bool b : list) key.push_back(b ? 1 : 0);
  } else {
    return false;  // a generator, a list of optional tensors, a complex number, ...
  }
  return true;
}

// --- the kernel --------------------------------------------------------------------------

std::mutex g_ops_mutex;
std::unordered_map<int64_t, NativeOp*> g_ops;  // by handle, while registered
int64_t g_next_handle = 1;

class NativeOp final : public c10::OperatorKernel {
 public:
  // grad: registered at an autograd key, where a call that autograd must record (grad
  // mode on and a tensor argument requiring grad) goes to the Python kernel, which builds
  // the graph; only the calls autograd leaves alone are keyed and replayed.
  NativeOp(int64_t handle, std::string name, bool grad)
      : handle_(handle), name_(std::move(name)), grad_(grad) {
    std::lock_guard<std::mutex> lock(g_ops_mutex);
    g_ops[handle_] = this;
  }
  ~NativeOp() override {
    std::lock_guard<std::mutex> lock(g_ops_mutex);
    g_ops.erase(handle_);
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    if (t_depth > 0) {
      // An aten call made while gemsops' Python kernel runs: the Python kernel takes it
      // (and hands it to torch, as it does for calls from inside its kernels).
      counts_.nested++;
      plain(op, stack);
      return;
    }
    const size_t n = op.schema().arguments().size();
    if (grad_ && at::GradMode::is_enabled() && needs_grad(*stack, n)) {
      counts_.unkeyed++;
      plain(op, stack);
      return;
    }
    thread_local Key key;
    thread_local std::vector<at::Tensor> inputs;
    key.clear();
    inputs.clear();
    // Global state the Python path reads: the default dtype, and the float32 matmul
    // precision (mm's kernels for float32 inputs depend on it).
    key.push_back(static_cast<int64_t>(c10::typeMetaToScalarType(c10::get_default_dtype())) |
                  (static_cast<int64_t>(at::globalContext().float32MatmulPrecision()) << 8));
    bool keyed = true;
    for (size_t i = stack->size() - n; i < stack->size(); ++i) {
      if (!key_value((*stack)[i], key, inputs)) {
        keyed = false;
        break;
      }
    }
    if (!keyed) {
      inputs.clear();
      counts_.unkeyed++;
      plain(op, stack);
      return;
    }
    std::shared_ptr<const Recipe> recipe;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (epoch_ != g_epoch.load()) {
        table_.clear();
        epoch_ = g_epoch.load();
      }
      auto it = table_.find(key);
      if (it != table_.end()) recipe = it->second;
    }
    if (recipe) {
      if (!recipe->refused && replay(*recipe, stack, n, inputs)) {
        inputs.clear();
        counts_.hits++;
        return;
      }
      inputs.clear();
      counts_.refused++;
      plain(op, stack);
      return;
    }
    inputs.clear();
    counts_.misses++;
    t_pending.push_back(Pending{this, key});
    t_depth++;
    try {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse3), stack);
    } catch (...) {
      t_depth--;
      t_pending.pop_back();
      throw;
    }
    t_depth--;
    t_pending.pop_back();
  }

  void keep(const Key& key, std::shared_ptr<const Recipe> recipe) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (epoch_ != g_epoch.load()) {
      table_.clear();
      epoch_ = g_epoch.load();
    }
    if (retired_) return;
    if (table_.size() >= kTableLimit) table_.clear();
    table_[key] = std::move(recipe);
    counts_.offered++;
  }

  std::vector<int64_t> stats() {
    size_t size;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      size = table_.size();
    }
    return {counts_.hits.load(), counts_.misses.load(), counts_.unkeyed.load(),
            counts_.refused.load(), counts_.offered.load(), counts_.nested.load(),
            static_cast<int64_t>(size)};
  }

  const std::string& name() const { return name_; }

  void retire() {
    std::lock_guard<std::mutex> lock(mutex_);
    table_.clear();
    retired_ = true;
  }

 private:
  static bool needs_grad(const torch::jit::Stack& stack, size_t n) {
    for (size_t i = stack.size() - n; i < stack.size(); ++i) {
      const c10::IValue& v = stack[i];
      if (v.isTensor()) {
        if (v.toTensor().requires_grad()) return true;
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList()) {
          if (t.defined() && t.requires_grad()) return true;
        }
      }
    }
    return false;
  }

  static void plain(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    t_depth++;
    try {
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse2), stack);
    } catch (...) {
      t_depth--;
      throw;
    }
    t_depth--;
  }

  // Allocates and launches as the recipe says; false (nothing done) where it cannot
  // (another device is current, no driver).
  bool replay(const Recipe& r, torch::jit::Stack* stack, size_t n,
              const std::vector<at::Tensor>& ins) {
    thread_local std::vector<at::Tensor> outs, works, scratch;
    c10::Device device(c10::kCPU);
    void* stream = nullptr;
    const bool launching = g_mode.load() == 0;
    if (r.device >= 0) {
      const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
      device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(r.device));
      if (impl->getDevice().index() != r.device) return false;
      if (launching) {
        load_driver();
        if (g_cu_launch == nullptr || g_stream_of == nullptr) return false;
        c10::Stream s = impl->getStream(device);
        stream = g_stream_of(&s);
      }
    } else if (launching) {
      return false;  // CPU recipes are for the logged mode only
    }
    // Everything that could refuse is checked before the first allocation or launch.
    for (const Launch& l : r.launches) {
      for (const Slot& s : l.slots) {
        if (s.kind == kInput && static_cast<size_t>(s.a) >= ins.size()) return false;
      }
    }
    for (const auto& [kind, value] : r.results) {
      if (kind == 1 && static_cast<size_t>(value) >= ins.size()) return false;
    }
    outs.clear();
    works.clear();
    auto make = [&](const Alloc& a) {
      return at::empty_strided(a.sizes, a.strides, at::TensorOptions().dtype(a.dtype).device(device));
    };
    for (const Alloc& a : r.outputs) outs.push_back(make(a));
    for (const Alloc& a : r.works) works.push_back(make(a));
    for (const Launch& l : r.launches) {
      const size_t m = l.slots.size();
      uint64_t values[64];
      void* params[64];
      scratch.clear();
      for (size_t j = 0; j < m; ++j) {
        const Slot& s = l.slots[j];
        uint64_t v = 0;
        switch (s.kind) {
          case kConst: v = static_cast<uint64_t>(s.a); break;
          case kInput: v = reinterpret_cast<uintptr_t>(ins[s.a].data_ptr()) + s.b; break;
          case kOutput: v = reinterpret_cast<uintptr_t>(outs[s.a].data_ptr()) + s.b; break;
          case kWork: v = reinterpret_cast<uintptr_t>(works[s.a].data_ptr()) + s.b; break;
          case kScratch: {
            scratch.push_back(at::empty_strided({l.scratch}, {1}, at::TensorOptions().dtype(at::kByte).device(device)));
            v = reinterpret_cast<uintptr_t>(scratch.back().data_ptr());
            break;
          }
          default: v = 0; break;
        }
        values[j] = v;
        params[j] = &values[j];
      }
      if (l.gx * l.gy * l.gz == 0) continue;
      if (launching) {
        const int rc = g_cu_launch(reinterpret_cast<void*>(l.function), static_cast<unsigned>(l.gx),
                                   static_cast<unsigned>(l.gy), static_cast<unsigned>(l.gz),
                                   static_cast<unsigned>(l.threads), 1, 1,
                                   static_cast<unsigned>(l.shared), stream, params, nullptr);
        TORCH_CHECK(rc == 0, "gemsops native replay of ", name_, ": cuLaunchKernel failed with CUresult ", rc);
      } else {
        std::lock_guard<std::mutex> lock(g_log_mutex);
        if (g_log.size() < kLogLimit) {
          g_log.insert(g_log.end(), {l.function, l.gx, l.gy, l.gz, l.threads, l.shared,
                                     static_cast<int64_t>(m)});
          for (size_t j = 0; j < m; ++j) g_log.push_back(static_cast<int64_t>(values[j]));
        }
      }
    }
    // The results, in place of the arguments.
    thread_local std::vector<c10::IValue> results;
    results.clear();
    for (const auto& [kind, value] : r.results) {
      switch (kind) {
        case 0: results.emplace_back(outs[value]); break;
        case 1: results.emplace_back(ins[value]); break;
        case 2: results.emplace_back(value); break;
        case 3: results.emplace_back(at::Tensor()); break;
        case 4: results.emplace_back(); break;
        case 5: results.emplace_back(value != 0); break;
        default: {
          double d;
          std::memcpy(&d, &value, sizeof d);
          results.emplace_back(d);
        }
      }
    }
    torch::jit::drop(*stack, n);
    for (auto& v : results) stack->push_back(std::move(v));
    results.clear();
    outs.clear();
    works.clear();
    scratch.clear();
    return true;
  }

  int64_t handle_;
  std::string name_;
  bool grad_;
  std::mutex mutex_;
  int64_t epoch_ = 0;
  std::unordered_map<Key, std::shared_ptr<const Recipe>, VecHash> table_;
  bool retired_ = false;
  Counts counts_;
};

// --- the recipe's flat form (gemsops/native/recipe.py writes it) -----------------------

struct Reader {
  const std::vector<int64_t>& v;
  size_t at = 0;
  int64_t next() {
    TORCH_CHECK(at < v.size(), "gemsops native: a recipe ends early");
    return v[at++];
  }
};

Alloc read_alloc(Reader& r) {
  Alloc a;
  a.dtype = static_cast<c10::ScalarType>(r.next());
  const int64_t dim = r.next();
  for (int64_t i = 0; i < dim; ++i) a.sizes.push_back(r.next());
  for (int64_t i = 0; i < dim; ++i) a.strides.push_back(r.next());
  return a;
}

std::shared_ptr<Recipe> parse(const std::vector<int64_t>& blob) {
  auto recipe = std::make_shared<Recipe>();
  Reader r{blob};
  const int64_t version = r.next();
  if (version == 0) {
    recipe->refused = true;
    return recipe;
  }
  TORCH_CHECK(version == 1, "gemsops native: unknown recipe version ", version);
  recipe->device = r.next();
  const int64_t n_out = r.next(), n_work = r.next(), n_launch = r.next(), n_result = r.next();
  for (int64_t i = 0; i < n_out; ++i) recipe->outputs.push_back(read_alloc(r));
  for (int64_t i = 0; i < n_work; ++i) recipe->works.push_back(read_alloc(r));
  for (int64_t i = 0; i < n_launch; ++i) {
    Launch l;
    l.function = r.next();
    l.gx = r.next();
    l.gy = r.next();
    l.gz = r.next();
    l.threads = r.next();
    l.shared = r.next();
    l.scratch = r.next();
    const int64_t m = r.next();
    TORCH_CHECK(m >= 0 && m <= 64, "gemsops native: ", m, " kernel parameters (at most 64)");
    for (int64_t j = 0; j < m; ++j) {
      Slot s{r.next(), r.next(), r.next()};
      l.slots.push_back(s);
    }
    recipe->launches.push_back(std::move(l));
  }
  for (int64_t i = 0; i < n_result; ++i) {
    const int64_t kind = r.next(), value = r.next();
    TORCH_CHECK(kind >= 0 && kind <= 6, "gemsops native: unknown result kind ", kind);
    TORCH_CHECK(kind != 0 || (value >= 0 && value < n_out), "gemsops native: output ", value, " of ", n_out);
    recipe->results.emplace_back(kind, value);
  }
  for (const Launch& l : recipe->launches) {
    for (const Slot& s : l.slots) {
      TORCH_CHECK(s.kind >= kConst && s.kind <= kNull, "gemsops native: unknown slot kind ", s.kind);
      TORCH_CHECK(s.kind != kOutput || (s.a >= 0 && s.a < n_out), "gemsops native: output ", s.a, " of ", n_out);
      TORCH_CHECK(s.kind != kWork || (s.a >= 0 && s.a < n_work), "gemsops native: workspace ", s.a, " of ", n_work);
      TORCH_CHECK(s.kind != kInput || s.a >= 0, "gemsops native: input ", s.a);
    }
  }
  TORCH_CHECK(r.at == blob.size(), "gemsops native: ", blob.size() - r.at, " words after the recipe");
  return recipe;
}

// --- the control ops -----------------------------------------------------------------------

std::mutex g_libs_mutex;
std::unordered_map<int64_t, std::unique_ptr<torch::Library>> g_libs;

// Serving an op overrides torch's kernel at that key, which torch reports once per
// process on stderr ("Overriding a previously registered kernel ..."): the override is
// what gemsops is for, so that one message is dropped; every other warning goes on.
class QuietOverride final : public c10::WarningHandler {
 public:
  explicit QuietOverride(c10::WarningHandler* next) : next_(next) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("Overriding a previously registered kernel") != std::string::npos) return;
    next_->process(warning);
  }

 private:
  c10::WarningHandler* next_;
};

int64_t serve(const std::string& name, const std::string& key) {
  QuietOverride quiet(c10::WarningUtils::get_warning_handler());
  c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  const c10::DispatchKey k = c10::parseDispatchKey(key);
  int64_t handle;
  {
    std::lock_guard<std::mutex> lock(g_ops_mutex);
    handle = g_next_handle++;
  }
  auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", k, __FILE__, __LINE__);
  const bool grad = c10::isIncludedInAlias(k, c10::DispatchKey::Autograd);
  lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                              std::make_unique<NativeOp>(handle, name, grad)));
  std::lock_guard<std::mutex> lock(g_libs_mutex);
  g_libs[handle] = std::move(lib);
  return handle;
}

// Deregisters one native kernel. With keep_alive, the kernel object outlives its
// registration (a call another thread looked up just before stays valid; its recipes are
// dropped): what gemsops asks for while other threads run.
void release(int64_t handle, bool keep_alive) {
  std::unique_ptr<torch::Library> lib;
  {
    std::lock_guard<std::mutex> lock(g_libs_mutex);
    auto it = g_libs.find(handle);
    if (it == g_libs.end()) return;
    lib = std::move(it->second);
    g_libs.erase(it);
  }
  if (keep_alive) {
    std::lock_guard<std::mutex> lock(g_ops_mutex);
    auto it = g_ops.find(handle);
    if (it != g_ops.end()) {
      it->second->retire();
      c10::raw::intrusive_ptr::incref(it->second);
    }
  }
  lib.reset();  // deregisters the kernel
}

void offer(const std::vector<int64_t>& blob) {
  if (t_pending.empty()) return;
  Pending& p = t_pending.back();
  auto recipe = parse(blob);
  p.op->keep(p.key, std::move(recipe));
}

void clear() { g_epoch++; }

void set_mode(int64_t mode) {
  TORCH_CHECK(mode == 0 || mode == 1, "gemsops native: mode must be 0 (launch) or 1 (log); got ", mode);
  g_mode = mode;
}

std::vector<int64_t> take_log() {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  std::vector<int64_t> out;
  out.swap(g_log);
  return out;
}

std::vector<int64_t> stats(int64_t handle) {
  std::lock_guard<std::mutex> lock(g_ops_mutex);
  auto it = g_ops.find(handle);
  if (it == g_ops.end()) return {};
  return it->second->stats();
}

bool driver() {
  load_driver();
  return g_cu_launch != nullptr && g_stream_of != nullptr;
}

}  // namespace

TORCH_LIBRARY(gemsops_native, m) {
  m.def("serve(str name, str key) -> int", &serve);
  m.def("release(int handle, bool keep_alive=False) -> ()", &release);
  m.def("offer(int[] blob) -> ()", [](std::vector<int64_t> blob) { offer(blob); });
  m.def("clear() -> ()", &clear);
  m.def("set_mode(int mode) -> ()", &set_mode);
  m.def("take_log() -> int[]", &take_log);
  m.def("stats(int handle) -> int[]", &stats);
  m.def("driver() -> bool", &driver);
  m.def("dtype_code(ScalarType dtype) -> int", [](c10::ScalarType t) { return static_cast<int64_t>(t); });
}
