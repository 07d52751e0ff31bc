// ascendc_pack/rt/manifest.hpp - the fields of manifest.json the C++ API reads, typed and
// checked with the Python reader's bounds (ascendc_pack_runtime/manifest.py is the contract;
// docs/FORMAT.md documents it). No torch here: dtypes stay names, runtime.hpp maps them.
//
// Every bound is the Python one: dimensions, strides and indices in [0, 2^48), at most 64
// dimensions, member sizes and weight offsets below 2^62, a weight's span computed in 128-bit
// arithmetic (a shape of [2^62 + 1] is a field error, never an overflow), weights aligned,
// disjoint and inside weights.bin, an aliased output naming a mutated input.
#ifndef ASCENDC_PACK_RT_MANIFEST_HPP
#define ASCENDC_PACK_RT_MANIFEST_HPP

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "contract.hpp"
#include "errors.hpp"
#include "json.hpp"

namespace ascendc_pack {
namespace contract {

struct Tensor {  // an input, an output or a weight
  std::string name, dtype;
  std::vector<int64_t> shape, stride;  // stride empty: any layout (outputs)
  int64_t input_index = -1;            // outputs: >= 0 when the output is that mutated input
  int64_t offset = 0, nbytes = 0;      // weights
};
struct Kernel {
  std::string name, kernel_key, file;
};
struct Member {
  int64_t size = 0;
  std::string sha256;
};
struct Manifest {
  std::string model_name = "model", backend, arch, march, torch_version, weights_file, graph_library, ns;
  std::vector<std::string> isa;
  std::optional<bool> cxx11_abi;
  std::vector<Tensor> inputs, outputs, weights;
  std::vector<int64_t> mutated;  // input indices, in manifest order
  int64_t alignment = 64, graph_abi = 0;
  std::vector<Kernel> kernels;
  std::vector<std::pair<std::string, Member>> members;  // archive order
  std::map<std::string, size_t> member_index;

  const Member* member(const std::string& name) const {
    auto it = member_index.find(name);
    return it == member_index.end() ? nullptr : &members[it->second].second;
  }
  // the members that are dlopen()ed: graph.so and every kernel library
  std::vector<std::string> libraries() const {
    std::vector<std::string> out{graph_library};
    for (const auto& k : kernels)
      if (std::find(out.begin(), out.end(), k.file) == out.end()) out.push_back(k.file);
    return out;
  }
};

[[noreturn]] inline void field_error(const std::string& field, const std::string& problem) {
  throw BundleFormatError("manifest.json: field '" + field + "' " + problem +
                              "; the bundle is corrupt or from another tool: " + kRebuild,
                          "", field, kRebuild);
}

inline int64_t itemsize_of(const std::string& dtype) {
  for (const auto& d : kDtypes)
    if (dtype == d.name) return d.itemsize;
  return 0;
}

// A safe relative member name: '/'-separated components of [A-Za-z0-9_.+-], not starting with
// '.' or '-', at most 255 characters each and 4096 in all (the Python rule).
inline bool safe_member_name(const std::string& name) {
  if (name.empty() || int64_t(name.size()) > kMaxNameChars) return false;
  size_t start = 0;
  while (true) {
    size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    size_t len = end - start;
    if (len == 0 || int64_t(len) > kMaxComponentChars) return false;
    char c0 = name[start];
    if (!(std::isalnum(static_cast<unsigned char>(c0)) || c0 == '_')) return false;
    for (size_t k = start; k < end; ++k) {
      char c = name[k];
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '+' || c == '-')) return false;
    }
    if (end == name.size()) return true;
    start = end + 1;
  }
}

namespace parse {

using detail::Json;

inline const Json& need(const Json& obj, const std::string& key, Json::Type type, const std::string& where) {
  const Json* v = obj.get(key);
  std::string path = where.empty() ? key : where + "." + key;
  if (!v) field_error(path, "is missing");
  if (v->type != type) field_error(path, "has the wrong type");
  return *v;
}

inline int64_t integer(const Json& obj, const std::string& key, int64_t lo, int64_t hi, const std::string& where) {
  const Json* v = obj.get(key);
  std::string path = where.empty() ? key : where + "." + key;
  if (!v) field_error(path, "is missing");
  if (!v->is_integer() || v->i < lo || v->i >= hi)
    field_error(path, "is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
  return v->i;
}

inline std::vector<int64_t> dims(const Json& v, const std::string& where) {
  if (v.type != Json::Type::Array) field_error(where, "is not a list of integers");
  if (int64_t(v.arr.size()) > kMaxNdim) field_error(where, "has more than " + std::to_string(kMaxNdim) + " dimensions");
  std::vector<int64_t> out;
  for (size_t d = 0; d < v.arr.size(); ++d) {
    const Json& x = v.arr[d];
    if (!x.is_integer() || x.i < 0 || x.i >= kMaxDim)
      field_error(where + "[" + std::to_string(d) + "]", "is not an integer in [0, 2**48)");
    out.push_back(x.i);
  }
  return out;
}

inline Tensor tensor(const Json& v, const std::string& where, bool stride_required) {
  if (v.type != Json::Type::Object) field_error(where, "is not a JSON object");
  Tensor t;
  t.name = need(v, "name", Json::Type::String, where).s;
  t.dtype = need(v, "dtype", Json::Type::String, where).s;
  if (!itemsize_of(t.dtype)) field_error(where + ".dtype", "is '" + t.dtype + "', not a dtype this runtime knows");
  const Json* shape = v.get("shape");
  if (!shape) field_error(where + ".shape", "is missing");
  t.shape = dims(*shape, where + ".shape");
  const Json* stride = v.get("stride");
  if (stride && stride->type != Json::Type::Null) {
    t.stride = dims(*stride, where + ".stride");
    if (t.stride.size() != t.shape.size()) field_error(where + ".stride", "does not have one entry per dimension");
  } else if (stride_required) {
    field_error(where + ".stride", "is missing");
  }
  return t;
}

// Bytes from the first to one past the last element a layout addresses; 128-bit arithmetic:
// with every dim and stride < 2^48 no term overflows, and a result >= 2^62 is refused.
inline int64_t span_bytes(const Tensor& t, const std::string& where) {
  for (int64_t n : t.shape)
    if (n == 0) return 0;
  __int128 span = 1;
  for (size_t d = 0; d < t.shape.size(); ++d) span += __int128(t.shape[d] - 1) * __int128(t.stride[d]);
  span *= itemsize_of(t.dtype);
  if (span >= __int128(kMaxMemberBytes)) field_error(where, "spans 2**62 bytes or more (shape and strides too large)");
  return int64_t(span);
}

inline bool is_hex(const std::string& s, size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

inline void members(const Json& m, Manifest& out) {
  const Json& ms = need(m, "members", Json::Type::Object, "");
  if (int64_t(ms.obj.size()) > kMaxMembers) field_error("members", "lists more than 100000 members");
  for (const auto& [name, info] : ms.obj) {
    if (!safe_member_name(name))
      throw BundleIntegrityError("manifest.json lists the unsafe member name '" + name.substr(0, 200) + "'; " + kRebuild,
                                 name.substr(0, 256), "members", kRebuild);
    if (name == kManifestName) field_error("members", "lists manifest.json itself");
    std::string where = "members['" + name + "']";
    if (info.type != Json::Type::Object) field_error(where, "is not a JSON object");
    Member mem;
    mem.size = integer(info, "size", 0, kMaxMemberBytes, where);
    mem.sha256 = need(info, "sha256", Json::Type::String, where).s;
    if (!is_hex(mem.sha256, 64)) field_error(where + ".sha256", "is not 64 lowercase hex digits");
    out.member_index[name] = out.members.size();
    out.members.emplace_back(name, mem);
  }
  // no member inside another member's file: one sorted pass, like the Python reader
  std::vector<std::string> names;
  for (const auto& kv : out.members) names.push_back(kv.first);
  std::sort(names.begin(), names.end());
  for (const auto& f : names) {
    std::string probe = f + "/";
    auto it = std::lower_bound(names.begin(), names.end(), probe);
    if (it != names.end() && it->compare(0, probe.size(), probe) == 0)
      throw BundleIntegrityError("manifest.json: member '" + it->substr(0, 200) + "' cannot be created: '" +
                                     f.substr(0, 200) + "' is itself a file member; " + kRebuild,
                                 *it, "members", kRebuild);
  }
}

inline void io(const Json& m, Manifest& out) {
  const Json& ins = need(m, "inputs", Json::Type::Array, "");
  const Json& outs = need(m, "outputs", Json::Type::Array, "");
  for (size_t i = 0; i < ins.arr.size(); ++i)
    out.inputs.push_back(tensor(ins.arr[i], "inputs[" + std::to_string(i) + "]", true));
  const Json& mus = need(m, "mutations", Json::Type::Array, "");
  for (size_t j = 0; j < mus.arr.size(); ++j) {
    std::string where = "mutations[" + std::to_string(j) + "]";
    if (mus.arr[j].type != Json::Type::Object) field_error(where, "is not a JSON object");
    const std::string& input = need(mus.arr[j], "input", Json::Type::String, where).s;
    int64_t idx = integer(mus.arr[j], "index", 0, kMaxDim, where);
    if (idx >= int64_t(out.inputs.size()) || out.inputs[size_t(idx)].name != input)
      field_error(where + ".index", "is not the position of input '" + input + "'");
    out.mutated.push_back(idx);
  }
  for (size_t i = 0; i < outs.arr.size(); ++i) {
    std::string where = "outputs[" + std::to_string(i) + "]";
    Tensor t = tensor(outs.arr[i], where, false);
    const Json* idx = outs.arr[i].get("input_index");
    if (idx && idx->type != Json::Type::Null) {
      t.input_index = integer(outs.arr[i], "input_index", 0, kMaxDim, where);
      if (std::find(out.mutated.begin(), out.mutated.end(), t.input_index) == out.mutated.end())
        field_error(where + ".input_index", "is not the index of an input the model mutates");
      const Tensor& src = out.inputs[size_t(t.input_index)];
      if (src.shape != t.shape || src.dtype != t.dtype)
        field_error(where + ".input_index", "names input '" + src.name + "' of another shape or dtype");
    }
    out.outputs.push_back(std::move(t));
  }
}

inline void weights(const Json& m, Manifest& out) {
  const Json& w = need(m, "weights", Json::Type::Object, "");
  out.weights_file = need(w, "file", Json::Type::String, "weights").s;
  const Member* file = out.member(out.weights_file);
  if (!file) field_error("weights.file", "is not one of the members");
  out.alignment = integer(w, "alignment", 1, (int64_t(1) << 20) + 1, "weights");
  if (out.alignment & (out.alignment - 1)) field_error("weights.alignment", "is not a power of two");
  const Json& tensors = need(w, "tensors", Json::Type::Array, "weights");
  std::vector<std::pair<int64_t, int64_t>> spans;  // (offset, end)
  for (size_t i = 0; i < tensors.arr.size(); ++i) {
    std::string where = "weights.tensors[" + std::to_string(i) + "]";
    Tensor t = tensor(tensors.arr[i], where, true);
    t.offset = integer(tensors.arr[i], "offset", 0, kMaxMemberBytes, where);
    t.nbytes = integer(tensors.arr[i], "nbytes", 0, kMaxMemberBytes, where);
    if (t.nbytes != span_bytes(t, where)) field_error(where + ".nbytes", "does not match its shape and strides");
    if (t.offset % out.alignment) field_error(where + ".offset", "is not a multiple of weights.alignment");
    if (t.offset + t.nbytes > file->size)  // both < 2^62: the sum cannot overflow
      field_error(where, "does not fit inside " + out.weights_file);
    if (t.nbytes) spans.emplace_back(t.offset, t.offset + t.nbytes);
    out.weights.push_back(std::move(t));
  }
  std::sort(spans.begin(), spans.end());
  for (size_t k = 1; k < spans.size(); ++k)
    if (spans[k].first < spans[k - 1].second) field_error("weights.tensors", "has overlapping tensors");
}

inline void graph_and_kernels(const Json& m, Manifest& out) {
  const Json& g = need(m, "graph", Json::Type::Object, "");
  out.graph_library = need(g, "library", Json::Type::String, "graph").s;
  if (!out.member(out.graph_library)) field_error("graph.library", "is not one of the members");
  out.ns = need(g, "namespace", Json::Type::String, "graph").s;
  if (out.ns.rfind("ascpack_", 0) != 0 || out.ns.size() < 16 || out.ns.size() > 72 ||
      !std::all_of(out.ns.begin() + 8, out.ns.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }))
    field_error("graph.namespace", "is not 'ascpack_' followed by 8-64 hex digits");
  out.graph_abi = integer(g, "abi", 0, int64_t(1) << 31, "graph");
  const Json& ks = need(m, "kernels", Json::Type::Array, "");
  for (size_t i = 0; i < ks.arr.size(); ++i) {
    std::string where = "kernels[" + std::to_string(i) + "]";
    if (ks.arr[i].type != Json::Type::Object) field_error(where, "is not a JSON object");
    Kernel k{need(ks.arr[i], "name", Json::Type::String, where).s, need(ks.arr[i], "kernel_key", Json::Type::String, where).s,
             need(ks.arr[i], "file", Json::Type::String, where).s};
    if (!out.member(k.file)) field_error(where + ".file", "is not one of the members");
    out.kernels.push_back(std::move(k));
  }
}

}  // namespace parse

// The typed manifest of a parsed manifest.json (BundleFormatError / BundleIntegrityError on
// anything the Python reader would refuse among the fields read here).
inline Manifest parse_manifest(const detail::Json& m) {
  using detail::Json;
  if (m.type != Json::Type::Object) field_error("(root)", "is not a JSON object");
  const Json* f = m.get("format");
  if (!f || !f->is_string() || f->s != kFormatName)
    throw BundleFormatError("manifest.json: field 'format' is not \"ascpack\"; this is not an ascendc-pack bundle",
                            "", "format", "pass an ascendc-pack bundle");
  const Json* ver = m.get("format_version");
  if (!ver || !ver->is_integer() || ver->i != kFormatVersion)
    throw BundleFormatError("manifest.json: field 'format_version' is not " + std::to_string(kFormatVersion) +
                                "; upgrade the runtime (newer bundle) or rebuild the bundle (older)",
                            "", "format_version", "upgrade the runtime or rebuild the bundle");
  Manifest out;
  parse::members(m, out);
  out.backend = parse::need(m, "backend", Json::Type::String, "").s;
  if (const Json* model = m.get("model"))
    if (const Json* n = model->get("name"); n && n->is_string()) out.model_name = n->s;
  const Json& target = parse::need(m, "target", Json::Type::Object, "");
  out.arch = parse::need(target, "arch", Json::Type::String, "target").s;
  out.march = parse::need(target, "march", Json::Type::String, "target").s;
  for (const auto& feat : parse::need(target, "isa", Json::Type::Array, "target").arr) {
    if (!feat.is_string()) field_error("target.isa", "is not a list of CPU feature names");
    out.isa.push_back(feat.s);
  }
  const Json& tv = parse::need(m, "torch", Json::Type::Object, "");
  out.torch_version = parse::need(tv, "version", Json::Type::String, "torch").s;
  if (out.torch_version.empty()) field_error("torch.version", "is empty");
  const Json* abi = tv.get("cxx11_abi");
  if (!abi) field_error("torch.cxx11_abi", "is missing");
  if (abi->type == Json::Type::Bool) out.cxx11_abi = abi->b;
  else if (abi->type != Json::Type::Null) field_error("torch.cxx11_abi", "is not true, false or null");
  parse::io(m, out);
  parse::weights(m, out);
  parse::graph_and_kernels(m, out);
  return out;
}

}  // namespace contract
}  // namespace ascendc_pack

#endif  // ASCENDC_PACK_RT_MANIFEST_HPP
