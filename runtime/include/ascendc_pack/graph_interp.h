// ascendc_pack/graph_interp.h - the interpreter of graph programs (graph ABI 1).
//
// Include this header in exactly one translation unit; ascendc-pack compiles that unit once per
// toolchain (compiler, flags, torch, these headers) into an object kept in its build cache and
// links it with each generated graph.cpp (ascendc_pack/graph_program.h) into a graph.so.
//
// What graph.so does (CppWrapper mode): ATen steps are boxed calls through c10::Dispatcher
// (operator handles and argument templates holding every constant prepared at load; a call
// copies the template, drops in the tensors and calls the kernel), fused kernels are static
// kernel libraries (ascendc_pack/kernel_abi.h) found relative to the bundle root and checked
// against the kernel_key baked into graph.cpp, torch.cond is a branch. It registers the
// operators <ns>::{init, run, release, signature, set_threads}; `ns` comes from graph.cpp.
#ifndef ASCENDC_PACK_GRAPH_INTERP_H_
#define ASCENDC_PACK_GRAPH_INTERP_H_

#include <ATen/EmptyTensor.h>
#include <ATen/record_function.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "ascendc_pack/fp_mode.h"
#include "ascendc_pack/gemm_abi.h"
#include "ascendc_pack/graph_program.h"
#include "ascendc_pack/graph_sizes.h"
#include "ascendc_pack/graph_tensors.h"
#include "ascendc_pack/kernel_abi.h"
#include "ascendc_pack/kernel_pool.h"
#include "ascendc_pack/npu_launch.h"
#include "ascendc_pack/task_pool.h"

namespace ap_interp {
namespace {

// ---- fused kernels -----------------------------------------------------------------------
struct Kernel {
  void* handle = nullptr;
  int (*launch)(void* const*, void* const*, void*, int32_t) = nullptr;
  // the same kernel on the graph's task pool (kernel_pool.h); null: the library runs OpenMP only
  int (*launch_pool)(void* const*, void* const*, void*, int32_t, const ap_pool*) = nullptr;
  // a jit kernel (kernel_abi.h): host tiling and launch with the sizes; null for a static kernel
  int (*tiling)(const int64_t*, int32_t, ap_jit_tiling*) = nullptr;
  int (*launch_jit)(void* const*, void* const*, void*, const int64_t*, const ap_jit_tiling*) = nullptr;
  const ap_kernel_spec* spec = nullptr;
  // an npu kernel library's device entry (npu_launch.h): launched through the npu launcher
  ap_npu_launch_fn npu_launch = nullptr;
  int64_t workspace = 0;  // its ap_kernel_info workspace bytes (the launcher allocates them)
};

// The task pool kernels run on, or null when ASCENDC_PACK_TASK_POOL=0 (every kernel then runs
// its OpenMP loop, as in the build's Python timing; docs/DESIGN.md §4.8).
const ap_pool* kernel_pool() {
  static const ap_pool* pool = [] {
    const char* env = std::getenv("ASCENDC_PACK_TASK_POOL");
    return env && std::strcmp(env, "0") == 0 ? nullptr : ::ascendc_pack::TaskPool::instance().abi();
  }();
  return pool;
}

// A jit kernel's entry points; "" when they are there and take the sizes the graph passes.
std::string load_jit(Kernel& k, const ap_kernel_spec& spec) {
  auto describe = reinterpret_cast<const ap_jit_info* (*)()>(dlsym(k.handle, "ap_kernel_jit_describe"));
  k.tiling = reinterpret_cast<int (*)(const int64_t*, int32_t, ap_jit_tiling*)>(dlsym(k.handle, "ap_kernel_tiling"));
  k.launch_jit = reinterpret_cast<int (*)(void* const*, void* const*, void*, const int64_t*, const ap_jit_tiling*)>(
      dlsym(k.handle, "ap_kernel_launch_jit"));
  if (!describe || !k.tiling || !k.launch_jit)
    return "it is not a jit kernel (no ap_kernel_jit_describe/ap_kernel_tiling/ap_kernel_launch_jit)";
  const ap_jit_info* info = describe();
  if (!info || info->abi_version != AP_KERNEL_JIT_ABI_VERSION)
    return "its jit ABI is not " + std::to_string(AP_KERNEL_JIT_ABI_VERSION);
  if (info->n_dims != spec.n_dims)
    return "it takes " + std::to_string(info->n_dims) + " sizes, the graph passes " + std::to_string(spec.n_dims);
  return "";
}

Kernel load_kernel(const std::string& root, const ap_kernel_spec& spec) {
  std::string path = root + "/" + spec.file;
  Kernel k;
  k.spec = &spec;
  k.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!k.handle) {
    const char* err = dlerror();
    fail(std::string("cannot load kernel library ") + spec.file + " of kernel " + spec.name + ": " +
         (err ? err : "unknown error") + "; the bundle is incomplete or was built for another host");
  }
  auto describe = reinterpret_cast<const ap_kernel_info* (*)()>(dlsym(k.handle, "ap_kernel_describe"));
  k.launch = reinterpret_cast<int (*)(void* const*, void* const*, void*, int32_t)>(
      dlsym(k.handle, "ap_kernel_launch"));
  k.launch_pool = reinterpret_cast<int (*)(void* const*, void* const*, void*, int32_t, const ap_pool*)>(
      dlsym(k.handle, "ap_kernel_launch_pool"));
  k.npu_launch = reinterpret_cast<ap_npu_launch_fn>(dlsym(k.handle, "ap_npu_launch"));
  std::string where = std::string("kernel library ") + spec.file;
  if (!describe || !k.launch) {
    dlclose(k.handle);
    fail(where + " does not export the ascendc-pack kernel ABI (ap_kernel_describe/ap_kernel_launch)");
  }
  const ap_kernel_info* info = describe();
  std::string problem;
  if (!info) problem = "ap_kernel_describe() returned NULL";
  else if (info->abi_version != AP_KERNEL_ABI_VERSION)
    problem = "kernel ABI " + std::to_string(info->abi_version) + ", the graph uses ABI " +
              std::to_string(AP_KERNEL_ABI_VERSION);
  else if (!info->kernel_key || std::strcmp(info->kernel_key, spec.kernel_key) != 0)
    problem = std::string("kernel_key ") + (info->kernel_key ? info->kernel_key : "(null)") +
              " does not match the kernel_key " + spec.kernel_key + " baked into the graph";
  else if (!info->name || std::strcmp(info->name, spec.name) != 0)
    problem = std::string("kernel name ") + (info->name ? info->name : "(null)") + " is not " + spec.name;
  else if (info->n_inputs != spec.n_inputs || info->n_outputs != spec.n_outputs)
    problem = "it takes " + std::to_string(info->n_inputs) + " inputs and " +
              std::to_string(info->n_outputs) + " outputs, the graph passes " +
              std::to_string(spec.n_inputs) + " and " + std::to_string(spec.n_outputs);
  else if (info->workspace > spec.workspace)
    problem = "it needs " + std::to_string(info->workspace) + " bytes of workspace, the graph plans " +
              std::to_string(spec.workspace);
  else if (spec.n_dims > 0)
    problem = load_jit(k, spec);
  if (!problem.empty()) {
    dlclose(k.handle);
    fail(where + " is not the kernel this graph was built with: " + problem +
         "; the bundle was modified or assembled from mismatched files, rebuild it");
  }
  k.workspace = info->workspace;
#ifdef AP_WITH_TORCH_NPU
  if (!k.npu_launch) {
    dlclose(k.handle);
    fail(where + " has no ap_npu_launch: a device npu graph runs npu kernel libraries only; rebuild the bundle");
  }
#endif
  return k;
}

inline void launch(const Kernel& k, void* const* ins, void* const* outs, void* ws, int32_t max_threads) {
  if (k.npu_launch) {  // npu kernel: stream, workspace and queue from the device (npu_launch.h)
    std::string error;
    const int rc = ascendc_pack::npu::launch(
        ascendc_pack::npu::active_device(), k.spec->name, k.npu_launch, k.workspace,
        std::vector<void*>(ins, ins + k.spec->n_inputs), std::vector<void*>(outs, outs + k.spec->n_outputs), &error);
    if (rc != 0) fail(error + " (kernel_key " + k.spec->kernel_key + ")");
    return;
  }
  const ap_pool* pool = k.launch_pool ? kernel_pool() : nullptr;
  int rc = pool ? k.launch_pool(ins, outs, ws, max_threads, pool) : k.launch(ins, outs, ws, max_threads);
  if (rc != 0)
    fail(std::string("fused kernel ") + k.spec->name + " (kernel_key " + k.spec->kernel_key +
         ") failed with status " + std::to_string(rc));
}

// A GEMM kernel's constant B packed once, at load, by the library's own ap_gemm_pack_b (the
// packed layout depends on the candidate's NR and the host ISA it was built for: never stored).
at::Tensor pack_b(const Kernel& k, const at::Tensor& b, int64_t nbytes) {
  auto describe = reinterpret_cast<const ap_gemm_info* (*)()>(dlsym(k.handle, "ap_gemm_describe"));
  auto pack = reinterpret_cast<int (*)(const void*, void*, int32_t)>(dlsym(k.handle, "ap_gemm_pack_b"));
  std::string where = std::string("GEMM kernel ") + k.spec->name;
  if (!describe || !pack) fail(where + " does not export ap_gemm_describe/ap_gemm_pack_b; rebuild the bundle");
  const ap_gemm_info* info = describe();
  if (!info || !info->b_packed || info->packed_b_bytes != nbytes)
    fail(where + " packs B into " + std::to_string(info ? info->packed_b_bytes : -1) +
         " bytes, the graph planned " + std::to_string(nbytes) + "; the bundle is inconsistent, rebuild it");
  at::Tensor packed = empty_strided({(nbytes + 3) / 4}, {1}, c10::ScalarType::Float);
  if (pack(b.data_ptr(), packed.data_ptr(), 0) != 0) fail(where + ": ap_gemm_pack_b failed");
  return packed;
}

// ---- io checks -----------------------------------------------------------------------------
template <typename Resolve>
void check_tensors(const std::vector<at::Tensor>& ts, const ap_tensor_spec* specs, int32_t n,
                   const char* what, Resolve resolve) {
  if (ts.size() != size_t(n))
    fail(std::string("expected ") + std::to_string(n) + " " + what + "s, got " + std::to_string(ts.size()));
  for (int32_t i = 0; i < n; ++i) {
    const auto& t = ts[i];
    const auto& s = specs[i];
    auto sizes_v = resolve(s.sizes, s.ndim), strides_v = resolve(s.strides, s.ndim);
    c10::IntArrayRef sizes(sizes_v), strides(strides_v);
    std::string name = std::string(what) + " " + std::to_string(i) + " (" + s.name + ")";
    if (!t.defined()) fail(name + " is undefined");
    if (t.device().type() != graph_device().type())
      fail(name + " is on " + t.device().str() + ", expected " + graph_device().str() +
           " (the device this bundle's graph runs on)");
    if (t.scalar_type() != dtype(s.dtype))
      fail(name + " has dtype " + c10::toString(t.scalar_type()) + ", expected " + c10::toString(dtype(s.dtype)));
    if (t.sizes() != sizes)
      fail(name + " has shape " + shape_str(t.sizes()) + ", expected " + shape_str(sizes));
    if (!same_layout(t, sizes, strides))
      fail(name + " has strides " + shape_str(t.strides()) + ", expected " + shape_str(strides));
  }
}

// ---- state -----------------------------------------------------------------------------
struct State {
  std::mutex mu;                  // one call at a time: the arena is shared by every call
  std::vector<at::Tensor> w;      // weights (zero-copy views of weights.bin)
  at::Tensor arena;               // the memory of every planned intermediate buffer
  std::vector<at::Tensor> t;      // static tensors: planned buffers and views of static tensors
  std::vector<Op> ops;
  std::vector<Kernel> kernels;
  int32_t max_threads = 0;        // every fused kernel's thread cap (set_threads); 0: its block_dim
  // a generic plan: the dims of the last call, every size expression at them, and the constant
  // arguments of operator templates that hold a size expression (refreshed when the dims change)
  bool dynamic = false;
  std::vector<int64_t> dims, exprs;
  std::vector<std::pair<int32_t, int32_t>> sym_args;
  ~State() {
    for (auto& k : kernels)
      if (k.handle) dlclose(k.handle);
  }
};

// The registers of one execution of an instruction list.
struct Frame {
  State& S;
  std::vector<at::Tensor>* in;     // null while initializing
  std::vector<at::Tensor> locals;

  at::Tensor& operator[](ap_ref r) {
    switch (r.space) {
      case AP_INPUT: return (*in)[r.index];
      case AP_WEIGHT: return S.w[r.index];
      case AP_STATIC: return S.t[r.index];
      case AP_LOCAL: return locals[r.index];
    }
    fail("internal error: register " + std::to_string(r.space) + ":" + std::to_string(r.index));
  }
};

// ---- dynamic dims (generic plans) -----------------------------------------------------------
using Ints = c10::SmallVector<int64_t, 8>;

// A size: itself, or the value of its expression at this call's dims.
inline int64_t size_of(const State& S, int64_t v) { return ap_is_sym(v) ? S.exprs[v - AP_SYM(0)] : v; }

Ints sizes_of(const State& S, const int64_t* p, int32_t n) {
  Ints out(p, p + n);
  if (S.dynamic)
    for (auto& v : out) v = size_of(S, v);
  return out;
}

c10::IValue constant(const ap_arg& a, const State* S = nullptr) {
  switch (a.kind) {
    case AP_ARG_NONE: return c10::IValue();
    case AP_ARG_INT: return c10::IValue(S ? size_of(*S, a.i) : a.i);
    case AP_ARG_DOUBLE: return c10::IValue(a.d);
    case AP_ARG_BOOL: return c10::IValue(a.i != 0);
    case AP_ARG_STRING: return c10::IValue(std::string(static_cast<const char*>(a.items)));
    case AP_ARG_INTS: {
      auto p = static_cast<const int64_t*>(a.items);
      if (S) {
        Ints v = sizes_of(*S, p, a.n);
        return c10::IValue(std::vector<int64_t>(v.begin(), v.end()));
      }
      return c10::IValue(std::vector<int64_t>(p, p + a.n));
    }
    case AP_ARG_DOUBLES: {
      auto p = static_cast<const double*>(a.items);
      return c10::IValue(std::vector<double>(p, p + a.n));
    }
    case AP_ARG_BOOLS: {
      auto p = static_cast<const bool*>(a.items);
      c10::List<bool> items;
      for (int32_t k = 0; k < a.n; ++k) items.push_back(p[k]);
      return c10::IValue(std::move(items));
    }
    case AP_ARG_DTYPE: return c10::IValue(dtype(a.i));
    case AP_ARG_LAYOUT_STRIDED: return c10::IValue(c10::Layout::Strided);
    case AP_ARG_MEMORY_FORMAT: return c10::IValue(memory_format(a.i));
    case AP_ARG_DEVICE_CPU: return c10::IValue(graph_device());  // the captured device: the graph's
    case AP_ARG_WRAPPED_INT: return c10::IValue(wrapped_scalar<int64_t>(a.i, c10::ScalarType::Long));
    case AP_ARG_WRAPPED_DOUBLE: return c10::IValue(wrapped_scalar<double>(a.d, c10::ScalarType::Double));
    case AP_ARG_WRAPPED_BOOL: return c10::IValue(wrapped_scalar<bool>(a.i != 0, c10::ScalarType::Bool));
    case AP_ARG_OPTIONAL_SCALARS:
      if (a.n != 0) fail("internal error: only an empty Scalar?[] constant is supported");
      return c10::IValue(c10::List<std::optional<c10::Scalar>>());
    case AP_ARG_TENSOR: case AP_ARG_TENSORS: case AP_ARG_OPTIONAL_TENSORS:
      return c10::IValue();  // filled in at load or per call
  }
  fail("internal error: unknown argument kind " + std::to_string(a.kind));
}

c10::IValue value(const ap_arg& a, Frame& f) {
  if (a.kind == AP_ARG_TENSOR) return c10::IValue(f[a.t]);
  auto refs = static_cast<const ap_ref*>(a.items);
  if (a.kind == AP_ARG_TENSORS) {
    c10::List<at::Tensor> items;
    items.reserve(a.n);
    for (int32_t k = 0; k < a.n; ++k) items.push_back(f[refs[k]]);
    return c10::IValue(std::move(items));
  }
  if (a.kind == AP_ARG_OPTIONAL_TENSORS) {
    c10::List<std::optional<at::Tensor>> items;
    items.reserve(a.n);
    for (int32_t k = 0; k < a.n; ++k)
      items.push_back(refs[k].space == AP_NOWHERE ? std::optional<at::Tensor>()
                                                  : std::optional<at::Tensor>(f[refs[k]]));
    return c10::IValue(std::move(items));
  }
  return constant(a, &f.S);
}

void call(const ap_insn& x, Frame& f) {
  Op& op = f.S.ops[x.a];
  torch::jit::Stack s(op.tmpl);
  for (int32_t k = 0; k < x.nargs; ++k) s[x.args[k].pos] = value(x.args[k].arg, f);
  op.op.callBoxed(&s);
  for (int32_t k = 0; k < x.nrefs; ++k) {
    if (x.refs[k].space == AP_NOWHERE) continue;
    f[x.refs[k]] = x.b ? s[0].toTensorList().get(k) : std::move(s[k]).toTensor();
  }
}

void launch_kernel(const ap_insn& x, Frame& f) {
  c10::SmallVector<void*, 16> ptrs;
  for (int32_t k = 0; k < x.nrefs; ++k) ptrs.push_back(f[x.refs[k]].data_ptr());
  ptrs.push_back(nullptr);  // never an empty array
  void* ws = x.src.space == AP_NOWHERE ? nullptr : f[x.src].data_ptr();
  const Kernel& k = f.S.kernels[x.a];
  // a profiler event named after the kernel (ATen steps get theirs from the dispatcher); one
  // thread-local check when no profiler runs
  RECORD_FUNCTION(k.spec->name, c10::ArrayRef<const c10::IValue>{});
  if (!k.launch_jit) {
    launch(k, ptrs.data(), ptrs.data() + x.b, ws, f.S.max_threads);
    return;
  }
  // the jit path: this call's sizes, the tiling chosen for them on the host, the launch
  Ints dims = sizes_of(f.S, x.shape, x.ndim);
  ap_jit_tiling t{};
  int rc = k.tiling(dims.data(), f.S.max_threads, &t);
  if (rc == 0) rc = k.launch_jit(ptrs.data(), ptrs.data() + x.b, ws, dims.data(), &t);
  if (rc != 0)
    fail(std::string("jit kernel ") + k.spec->name + " failed with status " + std::to_string(rc));
}

void exec(const ap_insn* code, int32_t n, Frame& f) {
  for (int32_t pc = 0; pc < n;) {
    const ap_insn& x = code[pc++];
    c10::IntArrayRef shape(x.shape, x.ndim), stride(x.stride, x.ndim);
    Ints dyn_shape, dyn_stride;
    if (f.S.dynamic && x.ndim > 0 && x.code != AP_LAUNCH) {  // a generic plan: sizes at this call's dims
      dyn_shape = sizes_of(f.S, x.shape, x.ndim), dyn_stride = sizes_of(f.S, x.stride, x.ndim);
      shape = c10::IntArrayRef(dyn_shape), stride = c10::IntArrayRef(dyn_stride);
    }
    switch (x.code) {
      case AP_CALL: call(x, f); break;
      case AP_SET_ARG: f.S.ops[x.a].tmpl[x.b] = value(x.args[0].arg, f); break;
      case AP_EMPTY: f[x.dst] = empty_strided(shape, stride, dtype(x.a)); break;
      case AP_ARENA: {
        int64_t nbytes = size_of(f.S, x.nbytes);
        if (f.S.dynamic && x.offset + nbytes > f.S.arena.numel())  // the plan bounds every size: never
          fail("internal error: a buffer of " + std::to_string(nbytes) + " bytes at offset " +
               std::to_string(x.offset) + " does not fit the arena (" + std::to_string(f.S.arena.numel()) + ")");
        f[x.dst] = arena_buffer(f.S.arena, x.offset, nbytes, dtype(x.a), shape, stride);
        break;
      }
      case AP_LAUNCH: launch_kernel(x, f); break;
      case AP_RELAYOUT: relayout(f[x.src], f[x.dst]); break;
      case AP_EXPECT: f[x.dst] = expect_layout(f[x.src], shape, stride); break;
      case AP_MOVE: f[x.dst] = f[x.src]; break;
      case AP_COPY: f[x.dst].copy_(f[x.src]); break;
      case AP_BRANCH:
        if (!(x.a < 0 ? truthy(f[x.src]) : x.a != 0)) pc = x.b;
        break;
      case AP_JUMP: pc = x.b; break;
      case AP_PACK_B: f[x.dst] = pack_b(f.S.kernels[x.a], f[x.src], x.nbytes); break;
      default: fail("internal error: unknown instruction " + std::to_string(x.code));
    }
  }
}

// ---- the registered operators --------------------------------------------------------------
const ap_graph& G = ap_graph_program;
std::mutex g_mu;
std::unordered_map<int64_t, std::shared_ptr<State>> g_states;
int64_t g_next = 1;

std::shared_ptr<State> get_state(int64_t handle) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_states.find(handle);
  if (it == g_states.end())
    fail("graph handle " + std::to_string(handle) + " is not loaded (released or never created)");
  return it->second;
}

// A generic plan's dims from the call's inputs (checked against their declared ranges), and
// every size expression and sized operator argument at them when they changed since the last call.
void bind_dims(State& S, const std::vector<at::Tensor>& in) {
  std::vector<int64_t> dims = ap_sizes::bind(G, in);
  if (dims == S.dims) return;
  S.exprs.resize(G.n_exprs);
  for (int32_t k = 0; k < G.n_exprs; ++k) S.exprs[k] = ap_sizes::eval(G, k, dims);
  S.dims = std::move(dims);
  for (auto [op, k] : S.sym_args) S.ops[op].tmpl[k] = constant(G.ops[op].args[k], &S);
}

int64_t graph_init(std::vector<at::Tensor> weights, std::string root) {
  if (G.program_version != AP_GRAPH_PROGRAM_VERSION)
    fail("graph.cpp holds program version " + std::to_string(G.program_version) + ", its interpreter " +
         std::to_string(AP_GRAPH_PROGRAM_VERSION) + "; rebuild the bundle");
  auto holder = std::make_shared<State>();
  State& S = *holder;
  check_tensors(weights, G.weights, G.n_weights, "weight", [](const int64_t* p, int32_t n) { return Ints(p, p + n); });
  S.dynamic = G.n_dims > 0;
  S.w = std::move(weights);
  for (int32_t i = 0; i < G.n_kernels; ++i) S.kernels.push_back(load_kernel(root, G.kernels[i]));
  S.arena = empty_strided({G.arena_bytes}, {1}, c10::ScalarType::Byte);
#ifdef AP_WITH_TORCH_NPU
  if (G.arena_bytes > 0) S.arena.zero_();
#else
  if (G.arena_bytes > 0) std::memset(S.arena.data_ptr(), 0, G.arena_bytes);  // fault pages in once
#endif
  S.t.resize(G.n_static);
  S.ops.reserve(G.n_ops);
  for (int32_t i = 0; i < G.n_ops; ++i) {
    torch::jit::Stack tmpl;
    tmpl.reserve(G.ops[i].nargs);
    for (int32_t k = 0; k < G.ops[i].nargs; ++k) {
      const ap_arg& a = G.ops[i].args[k];
      if (S.dynamic && ap_sizes::has_sym(a)) {  // a size of this call: set once the dims are known
        S.sym_args.emplace_back(i, k);
        tmpl.push_back(c10::IValue());
      } else {
        tmpl.push_back(constant(a));
      }
    }
    S.ops.push_back(make_op(G.ops[i].name, G.ops[i].overload, std::move(tmpl)));
  }
  Frame f{S, nullptr, {}};
  {
    ascendc_pack::FlushDenormals flush(G.flush_denormals != 0);  // as every call computes
    exec(G.init, G.n_init, f);  // planned buffers, tensors that never change, views of them
  }
  std::lock_guard<std::mutex> lock(g_mu);
  int64_t handle = g_next++;
  g_states[handle] = std::move(holder);
  return handle;
}

std::vector<at::Tensor> graph_run(int64_t handle, std::vector<at::Tensor> in) {
  auto holder = get_state(handle);
  State& S = *holder;
  std::lock_guard<std::mutex> lock(S.mu);
  ascendc_pack::FlushDenormals flush(G.flush_denormals != 0);  // this call's fp mode, restored after
  if (S.dynamic) bind_dims(S, in);
  check_tensors(in, G.inputs, G.n_inputs, "input", [&S](const int64_t* p, int32_t n) { return sizes_of(S, p, n); });
  Frame f{S, &in, std::vector<at::Tensor>(G.n_locals)};
  exec(G.run, G.n_run, f);
  std::vector<at::Tensor> out;
  out.reserve(G.n_returns);
  for (int32_t i = 0; i < G.n_returns; ++i) out.push_back(f[G.returns[i]]);
  return out;
}

void graph_release(int64_t handle) {
  std::shared_ptr<State> victim;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_states.find(handle);
    if (it == g_states.end()) return;
    victim = std::move(it->second);
    g_states.erase(it);
  }
}

std::string graph_signature() { return G.signature; }

// Cap the threads of every fused kernel of this graph state (the kernel ABI's max_threads);
// threads <= 0 lifts the cap (each kernel uses its tuned block_dim). ATen steps follow the
// calling thread's intra-op setting (at::set_num_threads), which the runtime sets per call.
void graph_set_threads(int64_t handle, int64_t threads) {
  auto holder = get_state(handle);
  std::lock_guard<std::mutex> lock(holder->mu);
  holder->max_threads = threads > 0 ? int32_t(std::min<int64_t>(threads, 1 << 20)) : 0;
}

void define_ops(torch::Library& m) {
  m.def("init(Tensor[] weights, str root) -> int", &graph_init);
  m.def("run(int handle, Tensor[] inputs) -> Tensor[]", &graph_run);
  m.def("release(int handle) -> ()", &graph_release);
  m.def("signature() -> str", &graph_signature);
  m.def("set_threads(int handle, int threads) -> ()", &graph_set_threads);
}

// TORCH_LIBRARY with the namespace graph.cpp names (ap_graph_program is constant-initialized,
// so it is ready before any dynamic initializer runs).
const torch::detail::TorchLibraryInit registrar(torch::Library::DEF, &define_ops, ap_graph_program.ns,
                                                std::nullopt, "ascendc_pack/graph_interp.h", 0);

}  // namespace
}  // namespace ap_interp

#endif  // ASCENDC_PACK_GRAPH_INTERP_H_
