// ascendc_pack/graph_tensors.h - the tensor side of the graph interpreter (graph_interp.h): the
// dtype codes, failures, boxed ATen calls, the graph's device, the memory the graph allocates and
// layout checks. Included by graph_interp.h only (one translation unit per graph.so).
#ifndef ASCENDC_PACK_GRAPH_TENSORS_H_
#define ASCENDC_PACK_GRAPH_TENSORS_H_

#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <stdexcept>
#include <string>

#include "ascendc_pack/graph_program.h"
#include "ascendc_pack/npu_launch.h"

namespace ap_interp {
namespace {

static_assert(int(c10::ScalarType::Byte) == AP_Byte && int(c10::ScalarType::Char) == AP_Char &&
              int(c10::ScalarType::Short) == AP_Short && int(c10::ScalarType::Int) == AP_Int &&
              int(c10::ScalarType::Long) == AP_Long && int(c10::ScalarType::Half) == AP_Half &&
              int(c10::ScalarType::Float) == AP_Float && int(c10::ScalarType::Double) == AP_Double &&
              int(c10::ScalarType::ComplexFloat) == AP_ComplexFloat &&
              int(c10::ScalarType::ComplexDouble) == AP_ComplexDouble &&
              int(c10::ScalarType::Bool) == AP_Bool && int(c10::ScalarType::BFloat16) == AP_BFloat16,
              "ap_dtype must match c10::ScalarType");

[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error(msg); }

std::string shape_str(c10::IntArrayRef xs) {
  std::string s = "[";
  for (size_t i = 0; i < xs.size(); ++i) s += (i ? ", " : "") + std::to_string(xs[i]);
  return s + "]";
}

inline c10::ScalarType dtype(int64_t code) { return static_cast<c10::ScalarType>(code); }

// ---- boxed ATen calls --------------------------------------------------------------------
struct Op {
  c10::OperatorHandle op;
  torch::jit::Stack tmpl;  // every argument; tensors that change per call are filled in per call
};

Op make_op(const char* name, const char* overload, torch::jit::Stack tmpl) {
  auto h = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!h) {
    fail(std::string("operator ") + name + (overload[0] ? "." : "") + overload +
         " is not registered in this process; the bundle needs a torch build that provides it "
         "(and any custom-op library it comes from must be imported before loading)");
  }
  return Op{*h, std::move(tmpl)};
}

// A Python number passed as a Tensor argument, wrapped as torch does (type promotion rules).
template <typename T>
at::Tensor wrapped_scalar(T v, c10::ScalarType dt) {
  at::Tensor t = at::detail::empty_cpu({}, dt);
  *static_cast<T*>(t.data_ptr()) = v;
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

c10::MemoryFormat memory_format(int64_t code) {
  switch (code) {
    case AP_Contiguous: return c10::MemoryFormat::Contiguous;
    case AP_Preserve: return c10::MemoryFormat::Preserve;
    case AP_ChannelsLast: return c10::MemoryFormat::ChannelsLast;
    case AP_ChannelsLast3d: return c10::MemoryFormat::ChannelsLast3d;
  }
  fail("internal error: unknown memory format " + std::to_string(code));
}

// ---- the graph's device ------------------------------------------------------------------
// cpu, or (a device npu bundle: graph.so compiled with -DAP_WITH_TORCH_NPU) the current NPU.
// Tensors the graph creates live there, inputs and weights must come from there.
#ifdef AP_WITH_TORCH_NPU
c10::Device graph_device() { return c10::Device(c10::DeviceType::PrivateUse1, c10_npu::current_device()); }
#else
c10::Device graph_device() { return c10::Device(c10::DeviceType::CPU); }
#endif

// ---- memory --------------------------------------------------------------------------------
at::Tensor empty_strided(c10::IntArrayRef sizes, c10::IntArrayRef strides, c10::ScalarType dt) {
#ifdef AP_WITH_TORCH_NPU
  return at::empty_strided(sizes, strides, at::TensorOptions().dtype(dt).device(graph_device()));
#else
  return at::detail::empty_strided_cpu(sizes, strides, dt);
#endif
}

void release_arena_ref(void* ctx) { delete static_cast<c10::Storage*>(ctx); }

// A planned buffer: its bytes live in the arena at byte_offset, but it is a Storage of its own,
// exactly nbytes long. ATen's *_scatter ops and the functional copy clone the *whole storage* of
// their input (clone_preserve_strides); with one Storage for the arena every such step copied
// the arena. The buffer's storage holds a reference to the arena's, so the memory stays valid
// as long as any view of the buffer lives.
at::Tensor arena_buffer(const at::Tensor& arena, int64_t byte_offset, int64_t nbytes,
                        c10::ScalarType dt, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  void* data = static_cast<char*>(arena.storage().mutable_data()) + byte_offset;
  c10::DataPtr ptr(data, new c10::Storage(arena.storage()), &release_arena_ref, arena.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(ptr), nullptr,
                       /*resizable=*/false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::computeDispatchKey(std::nullopt, c10::kStrided, arena.device())),
      c10::scalarTypeToTypeMeta(dt));
  impl->set_sizes_and_strides(sizes, strides, std::optional<int64_t>(0));
  return at::Tensor(std::move(impl));
}

bool same_layout(const at::Tensor& t, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  if (t.sizes() != sizes) return false;
  auto st = t.strides();
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] != 1 && st[i] != strides[i]) return false;
  return true;
}

// Copy src into dst's layout; dst may be compact (size 1) along broadcast dims of src.
void relayout(const at::Tensor& src, const at::Tensor& dst) {
  if (src.sizes() == dst.sizes()) {
    dst.copy_(src);
  } else {
    dst.copy_(src.as_strided(dst.sizes(), src.strides(), src.storage_offset()));
  }
}

// Safety net before a kernel reads a tensor whose layout was only predicted at build time.
at::Tensor expect_layout(const at::Tensor& t, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  if (same_layout(t, sizes, strides)) return t;
  if (t.sizes() != sizes) fail("internal error: tensor of shape " + shape_str(t.sizes()) +
                               " where the graph expects " + shape_str(sizes));
  std::vector<int64_t> base(sizes.begin(), sizes.end());
  for (size_t i = 0; i < sizes.size(); ++i)
    if (strides[i] == 0 && sizes[i] != 1) base[i] = 1;
  at::Tensor dst = empty_strided(base, strides, t.scalar_type());
  relayout(t, dst);
  return dst;
}

bool truthy(const at::Tensor& t) {
  if (t.numel() != 1) fail("torch.cond predicate has " + std::to_string(t.numel()) + " elements, expected 1");
  return t.item().toBool();
}

}  // namespace
}  // namespace ap_interp

#endif  // ASCENDC_PACK_GRAPH_TENSORS_H_
