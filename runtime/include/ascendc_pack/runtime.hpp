// ascendc_pack/runtime.hpp - C++ API of the ascendc-pack runtime (header-only, libtorch only).
//
// Loads a bundle that the Python runtime has verified and extracted, and runs it on at::Tensor
// inputs, for C++ inference servers:
//
//   # once per deployment (verifies every member, the zstd checksum and this host; prints the dir)
//   python -m ascendc_pack_runtime extract model.ascpack
//
//   #include <ascendc_pack/runtime.hpp>
//   auto model = ascendc_pack::Model::load(dir);          // checks again, then loads graph.so
//   std::vector<at::Tensor> out = model->run({x, y});      // flat outputs, manifest order
//
// Why an extracted directory: the bundle container (zstd + tar) is verified and unpacked by one
// implementation (ascendc_pack_runtime.extract), content-addressed and atomic; a directory is
// only there once everything checked out, and it carries the marker ".ascpack-verified". Before
// it dlopen()s anything this header applies the rules of ascendc_pack/rt/extraction.hpp (the
// cache rules at every level; the marker bound to manifest.json by its sha256; every member a
// private regular file of its size, and its sha256 with LoadOptions::verify_hashes or a trust
// policy), re-checks the
// manifest fields it reads with the Python reader's bounds (ascendc_pack/rt/manifest.hpp), the
// host (CPU architecture and ISA features, torch release, C++ ABI), and re-hashes every library
// right before loading it. Every refusal is an ascendc_pack::BundleError subclass whose message
// names the member or field and the fix; wrong inputs are std::invalid_argument.
//
// Build: g++ -std=c++20 -D_GLIBCXX_USE_CXX11_ABI=<torch's> -I<torch includes>
//        -I<ascendc_pack_runtime.include_dir()> app.cpp -L<torch lib> -ltorch_cpu -lc10 -ldl
// (see examples/cpp/). One Model may be called from many threads (calls are serialized by the
// graph); load a bundle once per thread for parallel calls.
#ifndef ASCENDC_PACK_RUNTIME_HPP
#define ASCENDC_PACK_RUNTIME_HPP

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/headeronly/version.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "rt/contract.hpp"
#include "rt/errors.hpp"
#include "rt/extraction.hpp"
#include "rt/json.hpp"
#include "rt/manifest.hpp"
#include "rt/trust.hpp"

namespace ascendc_pack {

struct TensorSpec {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;  // empty: any layout
  int64_t input_index = -1;     // outputs only: >= 0 when the output is that (mutated) input
};

struct LoadOptions {
  bool verify_hashes = false;  // rehash every member (sha256) instead of checking sizes only
                               // (a trust policy always does); libraries (graph.so, kernels)
                               // are always rehashed before dlopen
  bool check_host = true;      // ISA / architecture / torch / ABI checks (leave on)
  // The host's CPU feature flags for the ISA check; unset: read /proc/cpuinfo. Set it to check a
  // bundle against another machine's flags (or to test the refusal).
  std::optional<std::set<std::string>> host_cpu_flags;
  // Trust policy: public keys ("ed25519:<hex>") or key files; the bundle's manifest.sig must be a
  // valid signature by one of them (an empty list trusts nothing), and every member (weights
  // included) is hashed against the signed manifest. Unset: the environment variable
  // ASCENDC_PACK_RUNTIME_TRUSTED_KEYS (','-separated; set but naming no key is a TrustError),
  // else no policy. Needs libcrypto at run time (rt/trust.hpp).
  std::optional<std::vector<std::string>> trusted_keys;
  // Thread cap of every run() (0: none): the fused kernels' threads (the graph's set_threads;
  // graphs built before it ignore it) and at::set_num_threads on the calling thread for the
  // call, restored after (OpenMP's thread count is per thread). See ascendc_pack_runtime.threads.
  int threads = 0;
};

namespace detail {

struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr && addr != MAP_FAILED) munmap(addr, size);
  }
};

inline std::mutex& load_mutex() {
  static std::mutex mu;
  return mu;
}

inline c10::OperatorHandle find_op(const std::string& ns, const char* name) {
  auto h = c10::Dispatcher::singleton().findSchema({ns + "::" + name, ""});
  if (!h) throw BundleLoadError("graph.so does not register " + ns + "::" + name + "; " + kRebuild, "graph.so", "", kRebuild);
  return *h;
}

inline bool significant_layout_equal(const at::Tensor& t, const TensorSpec& s) {
  if (s.stride.empty()) return true;
  auto st = t.strides();
  for (size_t d = 0; d < s.shape.size(); ++d)
    if (s.shape[d] != 1 && st[d] != s.stride[d]) return false;
  return true;
}

inline at::ScalarType scalar_type(const std::string& dtype) {
  static const std::pair<const char*, at::ScalarType> table[] = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf},
      {"bfloat16", at::kBFloat16}, {"int64", at::kLong}, {"int32", at::kInt},
      {"int16", at::kShort}, {"int8", at::kChar}, {"uint8", at::kByte},
      {"bool", at::kBool}, {"complex64", at::kComplexFloat}, {"complex128", at::kComplexDouble}};
  for (const auto& [name, t] : table)
    if (dtype == name) return t;
  throw BundleFormatError("manifest.json: dtype '" + dtype + "' is not one this runtime knows; " + kRebuild, "", "dtype",
                          kRebuild);
}

// at::set_num_threads(n) on this thread for a scope, restored after (n <= 0 or unchanged: nothing)
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int n) : before_(n > 0 ? at::get_num_threads() : 0) {
    if (n > 0 && n != before_) at::set_num_threads(n);
    else before_ = 0;
  }
  ~IntraOpThreads() {
    if (before_ > 0) at::set_num_threads(before_);
  }
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;

 private:
  int before_;
};

inline TensorSpec spec_of(const contract::Tensor& t) {
  return TensorSpec{t.name, scalar_type(t.dtype), t.shape, t.stride, t.input_index};
}

}  // namespace detail

// ---------------------------------------------------------------------------------- Model
class Model {
 public:
  // Load the extracted bundle directory `dir` (see the top of this file). Thread-safe.
  static std::shared_ptr<Model> load(const std::string& dir, const LoadOptions& options = {}) {
    std::shared_ptr<Model> m(new Model());
    m->load_impl(dir, options);
    return m;
  }

  ~Model() {
    if (handle_ >= 0) {
      try {
        torch::jit::Stack st{c10::IValue(handle_)};
        if (release_op_) release_op_->callBoxed(&st);
      } catch (...) {
      }
    }
  }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Run one call. Inputs must match input_specs() in count, dtype, shape and device (cpu);
  // another memory layout is copied into the expected one (and mutations written back).
  // Returns the flat outputs in the order of output_specs(); an output that is a mutated input
  // is the caller's tensor itself.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) const {
    if (inputs.size() != inputs_.size())
      throw std::invalid_argument("model '" + name_ + "' takes " + std::to_string(inputs_.size()) +
                                  " input(s), got " + std::to_string(inputs.size()));
    std::vector<at::Tensor> prepared(inputs.begin(), inputs.end());
    std::vector<bool> copied(inputs.size(), false);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const auto& t = inputs[i];
      const auto& s = inputs_[i];
      std::string label = "input " + std::to_string(i) + " (" + s.name + ")";
      if (!t.defined()) throw std::invalid_argument(label + " is undefined");
      if (!t.device().is_cpu()) throw std::invalid_argument(label + " is on " + t.device().str() + "; this bundle runs on cpu");
      if (t.layout() != at::kStrided) throw std::invalid_argument(label + " is not a dense (strided) tensor");
      if (t.scalar_type() != s.dtype)
        throw std::invalid_argument(label + " has dtype " + std::string(c10::toString(t.scalar_type())) +
                                    ", expected " + c10::toString(s.dtype));
      if (t.sizes() != c10::IntArrayRef(s.shape))
        throw std::invalid_argument(label + " has shape " + c10::str(t.sizes()) + ", expected " +
                                    c10::str(c10::IntArrayRef(s.shape)) + "; the bundle was built for static shapes");
      if (!detail::significant_layout_equal(t, s) || t.is_conj() || t.is_neg()) {
        at::Tensor c = at::empty_strided(s.shape, s.stride.empty() ? t.strides() : c10::IntArrayRef(s.stride),
                                         at::TensorOptions().dtype(s.dtype));
        c.copy_(t);
        prepared[i] = c;
        copied[i] = true;
      }
    }
    torch::jit::Stack st{c10::IValue(handle_), c10::IValue(prepared)};
    {
      detail::IntraOpThreads cap(threads_);
      run_op_->callBoxed(&st);
    }
    std::vector<at::Tensor> out = st.at(0).toTensorVector();
    for (int64_t k : mutated_)
      if (copied[size_t(k)]) inputs[size_t(k)].copy_(prepared[size_t(k)]);
    for (size_t o = 0; o < outputs_.size() && o < out.size(); ++o)
      if (outputs_[o].input_index >= 0) out[o] = inputs[size_t(outputs_[o].input_index)];
    return out;
  }

  const std::string& name() const { return name_; }
  const std::string& directory() const { return dir_; }
  const std::vector<TensorSpec>& input_specs() const { return inputs_; }
  const std::vector<TensorSpec>& output_specs() const { return outputs_; }

 private:
  Model() = default;

  std::string dir_, name_, ns_;
  std::vector<TensorSpec> inputs_, outputs_;
  std::vector<int64_t> mutated_;
  std::shared_ptr<detail::Mapping> weights_map_;
  std::optional<c10::OperatorHandle> run_op_, release_op_;
  int64_t handle_ = -1;
  int threads_ = 0;
  bool hash_with_libcrypto_ = false;

  void load_impl(const std::string& dir_in, const LoadOptions& opt) {
    dir_ = dir_in;
    while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
    // a trust policy hashes every member (weights included) against the signed manifest, with
    // libcrypto's sha256 (loaded for the signature anyway)
    std::optional<std::set<std::string>> policy = trust::resolve_policy(opt.trusted_keys);
    hash_with_libcrypto_ = policy.has_value();
    contract::Manifest m = verified_manifest(policy);
    extraction::check_members(dir_, m, opt.verify_hashes || policy.has_value(), hash_with_libcrypto_);
    if (opt.check_host) check_host(m, opt);
    name_ = m.model_name;
    for (const auto& t : m.inputs) inputs_.push_back(detail::spec_of(t));
    for (const auto& t : m.outputs) outputs_.push_back(detail::spec_of(t));
    mutated_ = m.mutated;
    std::vector<at::Tensor> weights = map_weights(m);
    load_graph(m);
    init_graph(m, weights);
    if (opt.threads < 0) throw std::invalid_argument("LoadOptions::threads must be >= 0 (0: no cap)");
    threads_ = opt.threads;
    if (threads_ > 0)
      if (auto h = c10::Dispatcher::singleton().findSchema({ns_ + "::set_threads", ""})) {
        torch::jit::Stack st{c10::IValue(handle_), c10::IValue(int64_t(threads_))};
        h->callBoxed(&st);
      }
  }

  // 1. a private, symlink-free extraction in a cache that passes the cache rules at every level,
  //    whose marker is bound to its manifest.json, signed by a trusted key when a policy is set
  contract::Manifest verified_manifest(const std::optional<std::set<std::string>>& policy) {
    extraction::check_cache_path(extraction::dir_of(dir_));
    extraction::check_private_dir(dir_, "the extracted bundle");
    extraction::Marker marker = extraction::read_marker(dir_);
    std::string text = extraction::read_file(dir_ + "/" + kManifestName, kMaxManifestBytes, kManifestName);
    if (detail::sha256_hex(text) != marker.manifest_sha256)
      throw BundleIntegrityError(dir_ + "/manifest.json is not the manifest the extraction was verified with (its "
                                 "sha256 differs from the marker's); the extraction was modified: " +
                                     std::string(extraction::kExtractAgain),
                                 kManifestName, "", extraction::kExtractAgain);
    std::optional<std::string> sig;  // read (and held to the cache rules) whether or not a policy is set
    struct stat st;
    if (::lstat((dir_ + "/" + kSignatureName).c_str(), &st) == 0)
      sig = extraction::read_file(dir_ + "/" + kSignatureName, 1 << 16, kSignatureName);
    else if (errno != ENOENT)
      throw CacheError("cannot read " + dir_ + "/" + kSignatureName + ": " + std::strerror(errno), kSignatureName, "",
                       extraction::kExtractAgain);
    if (policy) trust::check_signature(text, sig, *policy, dir_);
    detail::Json json;
    try {
      json = detail::JsonParser(text).parse();
    } catch (const std::exception& e) {
      throw BundleFormatError(dir_ + "/manifest.json cannot be read (" + e.what() + "); " + extraction::kExtractAgain,
                              kManifestName, "", extraction::kExtractAgain);
    }
    return contract::parse_manifest(json);
  }

  // 2. the host, before anything is loaded
  static void check_host(const contract::Manifest& m, const LoadOptions& opt) {
    extraction::check_host_cpu(m, opt.host_cpu_flags);
    std::string want = m.torch_version.substr(0, m.torch_version.find('+'));
    if (want != TORCH_VERSION)
      throw IncompatibleBundleError("manifest.json: field 'torch.version': graph.so was built against torch " + m.torch_version +
                                        ", this program was compiled against libtorch " TORCH_VERSION
                                        "; use that libtorch or rebuild the bundle",
                                    "", "torch.version", "use the same libtorch or rebuild the bundle");
    if (m.cxx11_abi && *m.cxx11_abi != bool(_GLIBCXX_USE_CXX11_ABI))
      throw IncompatibleBundleError("manifest.json: field 'torch.cxx11_abi': graph.so was built with _GLIBCXX_USE_CXX11_ABI=" +
                                        std::to_string(int(*m.cxx11_abi)) + ", this program with " +
                                        std::to_string(int(_GLIBCXX_USE_CXX11_ABI)) + "; compile it with libtorch's ABI",
                                    "", "torch.cxx11_abi", "compile with -D_GLIBCXX_USE_CXX11_ABI matching libtorch");
  }

  // 3. weights: a private copy-on-write mapping of weights.bin, zero-copy tensors over it
  //    (every tensor was checked to lie inside the file's manifest size; the file has that size)
  std::vector<at::Tensor> map_weights(const contract::Manifest& m) {
    auto map = std::make_shared<detail::Mapping>();
    std::string wpath = dir_ + "/" + m.weights_file;
    int fd = ::open(wpath.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      int err = errno;
      throw CacheError("cannot open " + wpath + ": " + std::strerror(err), m.weights_file, "", extraction::kExtractAgain);
    }
    struct stat wst;
    if (::fstat(fd, &wst) != 0 || int64_t(wst.st_size) != m.member(m.weights_file)->size) {
      ::close(fd);
      throw CacheError(wpath + " changed size while loading; " + std::string(extraction::kExtractAgain), m.weights_file, "",
                       extraction::kExtractAgain);
    }
    map->size = size_t(wst.st_size);
    if (map->size > 0) {
      map->addr = ::mmap(nullptr, map->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      if (map->addr == MAP_FAILED) {
        int err = errno;
        ::close(fd);
        throw BundleLoadError("cannot map " + wpath + ": " + std::strerror(err), m.weights_file, "", "check memory limits");
      }
    }
    ::close(fd);
    weights_map_ = map;
    std::vector<at::Tensor> wts;
    for (const auto& w : m.weights) {
      auto options = at::TensorOptions().dtype(detail::scalar_type(w.dtype));
      if (w.nbytes == 0) {
        wts.push_back(at::empty_strided(w.shape, w.stride, options));
        continue;
      }
      auto keep = map;
      wts.push_back(at::from_blob(static_cast<char*>(map->addr) + w.offset, w.shape, w.stride,
                                  [keep](void*) mutable { keep.reset(); }, options));
    }
    return wts;
  }

  // 4. graph.so (loaded once per process: its TORCH_LIBRARY registers <namespace>::*), after
  //    re-hashing it and every kernel library it will dlopen
  void load_graph(const contract::Manifest& m) {
    if (m.graph_abi != kGraphAbi)
      throw BundleLoadError("manifest.json: field 'graph.abi' is not " + std::to_string(kGraphAbi) +
                                "; rebuild the bundle or upgrade the runtime", "", "graph.abi", kRebuild);
    ns_ = m.ns;
    const std::string& lib = m.graph_library;
    {
      std::lock_guard<std::mutex> lock(detail::load_mutex());
      if (!c10::Dispatcher::singleton().findSchema({ns_ + "::run", ""})) {
        for (const auto& name : m.libraries()) extraction::check_library(dir_, m, name, hash_with_libcrypto_);
        std::string path = dir_ + "/" + lib;
        void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!h) {
          const char* err = ::dlerror();
          throw BundleLoadError("cannot load " + lib + " of the bundle: " + std::string(err ? err : "unknown error") +
                                    "; it was built against torch " + m.torch_version, lib, "", kRebuild);
        }
        // never dlclose: the dispatcher keeps pointers into the library
      } else {
        // graph.so is loaded already (same namespace); init() still dlopens this directory's kernels
        for (const auto& k : m.kernels) extraction::check_library(dir_, m, k.file, hash_with_libcrypto_);
      }
    }
    run_op_ = detail::find_op(ns_, "run");
    release_op_ = detail::find_op(ns_, "release");
    // the graph's baked kernel list must be the manifest's
    torch::jit::Stack st;
    detail::find_op(ns_, "signature").callBoxed(&st);
    detail::Json sig;
    try {
      sig = detail::JsonParser(st.at(0).toStringRef()).parse();
    } catch (const std::exception& e) {
      throw BundleLoadError(lib + ": cannot read its signature (" + e.what() + "); " + kRebuild, lib, "", kRebuild);
    }
    std::set<std::string> want_k, have_k;
    for (const auto& k : m.kernels) want_k.insert(k.name + "|" + k.kernel_key + "|" + k.file);
    if (const detail::Json* ks = sig.get("kernels"); ks && ks->type == detail::Json::Type::Array)
      for (const auto& k : ks->arr) {
        const detail::Json* n = k.get("name");
        const detail::Json* key = k.get("kernel_key");
        const detail::Json* file = k.get("file");
        if (n && key && file) have_k.insert(n->s + "|" + key->s + "|" + file->s);
      }
    if (want_k != have_k)
      throw BundleLoadError(lib + " was built for other kernels than the manifest lists; the bundle was assembled "
                                  "from mismatched files: " + std::string(kRebuild), lib, "kernels", kRebuild);
  }

  // 5. the graph state: init() checks the weights and dlopens the kernels
  void init_graph(const contract::Manifest& m, std::vector<at::Tensor>& weights) {
    torch::jit::Stack ist{c10::IValue(weights), c10::IValue(dir_)};
    try {
      detail::find_op(ns_, "init").callBoxed(&ist);
    } catch (const std::exception& e) {
      std::string msg = e.what();
      msg = msg.substr(0, msg.find('\n'));
      throw BundleLoadError(dir_ + ": the graph refused to load: " + msg, m.graph_library, "", kRebuild);
    }
    handle_ = ist.at(0).toInt();
  }
};

}  // namespace ascendc_pack

#endif  // ASCENDC_PACK_RUNTIME_HPP
