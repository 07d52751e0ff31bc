// ascendc_pack/graph_sizes.h - the sizes of a generic plan (docs/DESIGN.md §2.10), for the graph
// interpreter (graph_interp.h): the dims of a call bound from its inputs and checked against their
// declared ranges, and the graph's size expressions evaluated at them (graph_program.h: AP_SYM).
#ifndef ASCENDC_PACK_GRAPH_SIZES_H_
#define ASCENDC_PACK_GRAPH_SIZES_H_

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "ascendc_pack/graph_program.h"

namespace ap_sizes {

// Whether a constant operator argument holds a size expression (set per call shape).
inline bool has_sym(const ap_arg& a) {
  if (a.kind == AP_ARG_INT) return ap_is_sym(a.i);
  if (a.kind != AP_ARG_INTS) return false;
  auto p = static_cast<const int64_t*>(a.items);
  return std::any_of(p, p + a.n, [](int64_t v) { return ap_is_sym(v); });
}

// Expression k of the graph's table at these dims (postfix code, ascendc_pack/ir/symbolic.py).
inline int64_t eval(const ap_graph& G, int32_t k, const std::vector<int64_t>& dims) {
  c10::SmallVector<int64_t, 16> st;
  for (int32_t i = G.expr_offsets[k]; i < G.expr_offsets[k + 1]; i += 2) {
    int64_t op = G.expr_code[i], v = G.expr_code[i + 1];
    if (op == AP_OP_CONST) { st.push_back(v); continue; }
    if (op == AP_OP_DIM) { st.push_back(dims[v]); continue; }
    int64_t b = st.back(); st.pop_back();
    int64_t& a = st.back();
    switch (op) {
      case AP_OP_ADD: a += b; break;
      case AP_OP_MUL: a *= b; break;
      case AP_OP_FLOORDIV: a = b ? (a / b - ((a % b != 0) && ((a < 0) != (b < 0)))) : 0; break;
      case AP_OP_MOD: a = b ? ((a % b) + b) % b : 0; break;
      case AP_OP_MAX: a = std::max(a, b); break;
      case AP_OP_MIN: a = std::min(a, b); break;
      default: throw std::runtime_error("internal error: size expression opcode " + std::to_string(op));
    }
  }
  return st.back();
}

// The dims of a call: each bound input dim's size, checked against its declared range and
// against the other input dims declared as the same dim.
inline std::vector<int64_t> bind(const ap_graph& G, const std::vector<at::Tensor>& in) {
  auto fail = [](const std::string& msg) { throw std::runtime_error(msg); };
  std::vector<int64_t> dims(G.n_dims, -1);
  for (int32_t i = 0; i < G.n_binds; ++i) {
    const ap_dim_bind& b = G.binds[i];
    if (size_t(b.input) >= in.size())
      fail("expected " + std::to_string(G.n_inputs) + " inputs, got " + std::to_string(in.size()));
    const at::Tensor& t = in[b.input];
    std::string where = "input " + std::to_string(b.input) + " (" + G.inputs[b.input].name + ")";
    if (!t.defined() || t.dim() <= b.dim)
      fail(where + " has " + std::to_string(t.defined() ? t.dim() : 0) + " dims, expected " +
           std::to_string(G.inputs[b.input].ndim));
    const ap_dim_spec& d = G.dims[b.sym];
    int64_t v = t.size(b.dim);
    if (v < d.min || v > d.max)
      fail(where + " dim " + std::to_string(b.dim) + " (" + d.name + ") is " + std::to_string(v) +
           ", outside the declared range [" + std::to_string(d.min) + ", " + std::to_string(d.max) + "]");
    if (dims[b.sym] >= 0 && dims[b.sym] != v)
      fail(where + " dim " + std::to_string(b.dim) + " (" + d.name + ") is " + std::to_string(v) + ", another "
           "input's is " + std::to_string(dims[b.sym]) + "; dims declared as one must have one size");
    dims[b.sym] = v;
  }
  return dims;
}

}  // namespace ap_sizes

#endif  // ASCENDC_PACK_GRAPH_SIZES_H_
