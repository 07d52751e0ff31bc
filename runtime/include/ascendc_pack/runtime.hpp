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
// implementation (ascendc_pack_runtime.bundle), content-addressed and atomic; a directory is only
// there once everything checked out, and it carries the marker file ".ascpack-verified". This
// header refuses a directory without the marker, re-checks the manifest (format, version,
// fields), every member's presence, type and size (and sha256 with LoadOptions::verify_hashes),
// and the host (CPU architecture and ISA features, torch release, C++ ABI) BEFORE it dlopen()s
// anything. Every refusal is an ascendc_pack::BundleError subclass whose message names the
// member or field and the fix; wrong inputs are std::invalid_argument.
//
// Build: g++ -std=c++20 -D_GLIBCXX_USE_CXX11_ABI=<torch's> -I<torch includes>
//        -I<ascendc_pack_runtime.include_dir()> app.cpp -L<torch lib> -ltorch_cpu -lc10 -ldl
// (see examples/cpp/). One Model may be called from many threads (calls are serialized by the
// graph); load a bundle once per thread for parallel calls.
#ifndef ASCENDC_PACK_RUNTIME_HPP
#define ASCENDC_PACK_RUNTIME_HPP

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/headeronly/version.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ascendc_pack {

constexpr int kFormatVersion = 1;
constexpr int64_t kGraphAbi = 1;

// ---------------------------------------------------------------------------------- errors
// Same families as the Python runtime (ascendc_pack_runtime.errors).
class BundleError : public std::runtime_error {
 public:
  BundleError(const std::string& msg, std::string member = "", std::string field = "", std::string fix = "")
      : std::runtime_error(msg), member_(std::move(member)), field_(std::move(field)), fix_(std::move(fix)) {}
  const std::string& member() const { return member_; }
  const std::string& field() const { return field_; }
  const std::string& fix() const { return fix_; }

 private:
  std::string member_, field_, fix_;
};
struct BundleNotFoundError : BundleError { using BundleError::BundleError; };
struct BundleFormatError : BundleError { using BundleError::BundleError; };       // manifest / format
struct BundleIntegrityError : BundleError { using BundleError::BundleError; };    // members vs manifest
struct IncompatibleBundleError : BundleError { using BundleError::BundleError; }; // host / torch / ABI
struct BundleLoadError : BundleError { using BundleError::BundleError; };         // graph.so / kernels

struct TensorSpec {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;  // empty: any layout
  int64_t input_index = -1;     // outputs only: >= 0 when the output is that (mutated) input
};

struct LoadOptions {
  bool verify_hashes = false;  // rehash every member (sha256) instead of checking sizes only
  bool check_host = true;      // ISA / architecture / torch / ABI checks (leave on)
};

namespace detail {

// ---------------------------------------------------------------------------------- JSON
struct Json {
  enum class Type { Null, Bool, Number, String, Array, Object };
  Type type = Type::Null;
  bool b = false;
  double num = 0;
  bool is_int = false;
  int64_t i = 0;
  std::string s;
  std::vector<Json> arr;
  std::vector<std::pair<std::string, Json>> obj;

  const Json* get(const std::string& key) const {
    if (type != Type::Object) return nullptr;
    for (const auto& kv : obj)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
  bool is_string() const { return type == Type::String; }
  bool is_integer() const { return type == Type::Number && is_int; }
};

class JsonParser {
 public:
  JsonParser(const std::string& text) : p_(text.data()), end_(text.data() + text.size()) {}
  Json parse() {
    Json v = value(0);
    ws();
    if (p_ != end_) fail("trailing characters");
    return v;
  }

 private:
  const char* p_;
  const char* end_;
  [[noreturn]] void fail(const char* what) { throw std::runtime_error(std::string("invalid JSON: ") + what); }
  void ws() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  bool lit(const char* word) {
    size_t n = std::strlen(word);
    if (size_t(end_ - p_) >= n && std::memcmp(p_, word, n) == 0) {
      p_ += n;
      return true;
    }
    return false;
  }
  Json value(int depth) {
    if (depth > 256) fail("nested too deeply");
    ws();
    if (p_ == end_) fail("unexpected end");
    Json v;
    char c = *p_;
    if (c == '{') {
      v.type = Json::Type::Object;
      ++p_;
      ws();
      if (p_ != end_ && *p_ == '}') { ++p_; return v; }
      while (true) {
        ws();
        if (p_ == end_ || *p_ != '"') fail("expected a key");
        std::string key = str();
        ws();
        if (p_ == end_ || *p_ != ':') fail("expected ':'");
        ++p_;
        v.obj.emplace_back(std::move(key), value(depth + 1));
        ws();
        if (p_ != end_ && *p_ == ',') { ++p_; continue; }
        if (p_ != end_ && *p_ == '}') { ++p_; return v; }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.type = Json::Type::Array;
      ++p_;
      ws();
      if (p_ != end_ && *p_ == ']') { ++p_; return v; }
      while (true) {
        v.arr.push_back(value(depth + 1));
        ws();
        if (p_ != end_ && *p_ == ',') { ++p_; continue; }
        if (p_ != end_ && *p_ == ']') { ++p_; return v; }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') { v.type = Json::Type::String; v.s = str(); return v; }
    if (lit("true")) { v.type = Json::Type::Bool; v.b = true; return v; }
    if (lit("false")) { v.type = Json::Type::Bool; return v; }
    if (lit("null")) return v;
    v.type = Json::Type::Number;
    if (lit("NaN")) { v.num = NAN; return v; }
    if (lit("Infinity")) { v.num = INFINITY; return v; }
    if (lit("-Infinity")) { v.num = -INFINITY; return v; }
    const char* start = p_;
    bool integer = true;
    if (p_ != end_ && *p_ == '-') ++p_;
    if (p_ == end_ || !(*p_ >= '0' && *p_ <= '9')) fail("unexpected character");
    while (p_ != end_ && ((*p_ >= '0' && *p_ <= '9') || *p_ == '.' || *p_ == 'e' || *p_ == 'E' ||
                          *p_ == '+' || *p_ == '-')) {
      if (*p_ == '.' || *p_ == 'e' || *p_ == 'E') integer = false;
      ++p_;
    }
    std::string text(start, p_);
    char* stop = nullptr;
    errno = 0;
    if (integer) {
      long long x = std::strtoll(text.c_str(), &stop, 10);
      if (errno == 0 && stop && *stop == 0) {
        v.is_int = true;
        v.i = x;
        v.num = double(x);
        return v;
      }
      errno = 0;
    }
    v.num = std::strtod(text.c_str(), &stop);
    if (!stop || *stop != 0) fail("bad number");
    return v;
  }
  void utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) out += char(cp);
    else if (cp < 0x800) { out += char(0xC0 | (cp >> 6)); out += char(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12)); out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18)); out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F)); out += char(0x80 | (cp & 0x3F));
    }
  }
  uint32_t hex4() {
    if (end_ - p_ < 4) fail("short \\u escape");
    uint32_t x = 0;
    for (int k = 0; k < 4; ++k, ++p_) {
      char c = *p_;
      x <<= 4;
      if (c >= '0' && c <= '9') x |= uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') x |= uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') x |= uint32_t(c - 'A' + 10);
      else fail("bad \\u escape");
    }
    return x;
  }
  std::string str() {
    ++p_;  // opening quote
    std::string out;
    while (true) {
      if (p_ == end_) fail("unterminated string");
      char c = *p_++;
      if (c == '"') return out;
      if (c != '\\') { out += c; continue; }
      if (p_ == end_) fail("unterminated escape");
      char e = *p_++;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && end_ - p_ >= 6 && p_[0] == '\\' && p_[1] == 'u') {
            p_ += 2;
            uint32_t lo = hex4();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          utf8(out, cp);
          break;
        }
        default: fail("bad escape");
      }
    }
  }
};

// ---------------------------------------------------------------------------------- sha256
class Sha256 {
 public:
  Sha256() { reset(); }
  void update(const uint8_t* data, size_t n) {
    total_ += n;
    while (n > 0) {
      size_t take = std::min(n, size_t(64) - fill_);
      std::memcpy(buf_ + fill_, data, take);
      fill_ += take;
      data += take;
      n -= take;
      if (fill_ == 64) { block(buf_); fill_ = 0; }
    }
  }
  std::string hex() {
    uint64_t bits = total_ * 8;
    uint8_t pad = 0x80;
    update(&pad, 1);
    uint8_t zero = 0;
    while (fill_ != 56) update(&zero, 1);
    uint8_t len[8];
    for (int k = 0; k < 8; ++k) len[k] = uint8_t(bits >> (56 - 8 * k));
    update(len, 8);
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (uint32_t w : h_)
      for (int k = 28; k >= 0; k -= 4) out += digits[(w >> k) & 0xF];
    return out;
  }

 private:
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t fill_ = 0;
  uint64_t total_ = 0;
  void reset() {
    static const uint32_t init[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    std::memcpy(h_, init, sizeof(h_));
  }
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void block(const uint8_t* p) {
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int t = 0; t < 16; ++t)
      w[t] = uint32_t(p[4 * t]) << 24 | uint32_t(p[4 * t + 1]) << 16 | uint32_t(p[4 * t + 2]) << 8 | p[4 * t + 3];
    for (int t = 16; t < 64; ++t) {
      uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int t = 0; t < 64; ++t) {
      uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[t] + w[t];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h_[0] += a; h_[1] += b; h_[2] += c; h_[3] += d; h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
  }
};

inline std::string sha256_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  Sha256 h;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    h.update(reinterpret_cast<const uint8_t*>(buf.data()), size_t(in.gcount()));
  }
  return h.hex();
}

// ---------------------------------------------------------------------------------- helpers
inline const char* kRebuild = "rebuild the bundle with `ascendc-pack build`";

inline std::string read_text(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::string text;
  std::vector<char> buf(1 << 16);
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    text.append(buf.data(), size_t(in.gcount()));
    if (text.size() > limit) throw std::runtime_error(path + " is larger than " + std::to_string(limit) + " bytes");
  }
  return text;
}

[[noreturn]] inline void field_error(const std::string& field, const std::string& problem) {
  throw BundleFormatError("manifest.json: field '" + field + "' " + problem +
                              "; the bundle is corrupt or from another tool: " + kRebuild,
                          "", field, kRebuild);
}

inline const Json& need(const Json& obj, const std::string& key, Json::Type type, const std::string& where) {
  const Json* v = obj.get(key);
  if (!v || v->type != type) field_error(where.empty() ? key : where + "." + key, "is missing or has the wrong type");
  return *v;
}

inline at::ScalarType parse_dtype(const Json& v, const std::string& where) {
  static const std::pair<const char*, at::ScalarType> table[] = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf},
      {"bfloat16", at::kBFloat16}, {"int64", at::kLong}, {"int32", at::kInt},
      {"int16", at::kShort}, {"int8", at::kChar}, {"uint8", at::kByte},
      {"bool", at::kBool}, {"complex64", at::kComplexFloat}, {"complex128", at::kComplexDouble}};
  if (v.is_string())
    for (const auto& [name, t] : table)
      if (v.s == name) return t;
  field_error(where, "is not a dtype this runtime knows");
}

inline std::vector<int64_t> parse_ints(const Json& v, const std::string& where) {
  if (v.type != Json::Type::Array) field_error(where, "is not a list of integers");
  std::vector<int64_t> out;
  for (const auto& x : v.arr) {
    if (!x.is_integer() || x.i < 0) field_error(where, "is not a list of non-negative integers");
    out.push_back(x.i);
  }
  return out;
}

inline TensorSpec parse_spec(const Json& v, const std::string& where) {
  if (v.type != Json::Type::Object) field_error(where, "is not an object");
  TensorSpec s;
  s.name = need(v, "name", Json::Type::String, where).s;
  const Json* dt = v.get("dtype");
  if (!dt) field_error(where + ".dtype", "is missing");
  s.dtype = parse_dtype(*dt, where + ".dtype");
  const Json* shape = v.get("shape");
  if (!shape) field_error(where + ".shape", "is missing");
  s.shape = parse_ints(*shape, where + ".shape");
  const Json* stride = v.get("stride");
  if (stride && stride->type != Json::Type::Null) {
    s.stride = parse_ints(*stride, where + ".stride");
    if (s.stride.size() != s.shape.size()) field_error(where + ".stride", "does not have one entry per dimension");
  }
  const Json* idx = v.get("input_index");
  if (idx && idx->type != Json::Type::Null) {
    if (!idx->is_integer()) field_error(where + ".input_index", "is not an integer");
    s.input_index = idx->i;
  }
  return s;
}

inline bool safe_member_name(const std::string& name) {
  if (name.empty() || name.size() > 4096 || name[0] == '/') return false;
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    std::string part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == ".." || part.size() > 255) return false;
    char c0 = part[0];
    if (!(std::isalnum(static_cast<unsigned char>(c0)) || c0 == '_')) return false;
    for (char c : part)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '+' || c == '-')) return false;
    start = end + 1;
  }
  return true;
}

inline std::string normalize_arch(std::string a) {
  std::transform(a.begin(), a.end(), a.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (a == "amd64" || a == "x64") return "x86_64";
  if (a == "arm64") return "aarch64";
  return a;
}

// This host's CPU flags (/proc/cpuinfo "flags" / "Features"); empty optional when unknown.
// ASCENDC_PACK_RUNTIME_TEST_CPU_FLAGS overrides them (tests only), as in the Python runtime.
inline bool host_cpu_flags(std::set<std::string>& out) {
  if (const char* env = std::getenv("ASCENDC_PACK_RUNTIME_TEST_CPU_FLAGS")) {
    std::string s(env);
    std::replace(s.begin(), s.end(), ',', ' ');
    std::istringstream words(s);
    for (std::string w; words >> w;) out.insert(w);
    return true;
  }
  std::ifstream in("/proc/cpuinfo");
  if (!in) return false;
  for (std::string line; std::getline(in, line);) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    if (key == "flags" || key == "Features") {
      std::istringstream words(line.substr(colon + 1));
      for (std::string w; words >> w;) out.insert(w);
      return true;
    }
  }
  return false;
}

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
    run_op_->callBoxed(&st);
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

  void load_impl(const std::string& dir_in, const LoadOptions& opt) {
    using detail::Json;
    using detail::kRebuild;
    dir_ = dir_in;
    while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
    struct stat sb;
    if (::stat(dir_.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode))
      throw BundleNotFoundError(dir_ + ": no such directory; pass a directory printed by "
                                "`python -m ascendc_pack_runtime extract BUNDLE`", "", "", "extract the bundle first");
    // 1. the Python runtime's marker: only complete, verified extractions carry it
    std::string marker = dir_ + "/.ascpack-verified";
    Json mk;
    try {
      mk = detail::JsonParser(detail::read_text(marker, 1 << 16)).parse();
    } catch (const std::exception& e) {
      throw BundleIntegrityError(dir_ + " is not a verified extraction (" + e.what() + "); extract the bundle with "
                                 "`python -m ascendc_pack_runtime extract BUNDLE` and pass the directory it prints",
                                 ".ascpack-verified", "", "extract the bundle with the Python runtime");
    }
    const Json* fmt = mk.get("format");
    if (!fmt || !fmt->is_string() || fmt->s != "ascpack-extracted")
      throw BundleIntegrityError(marker + " is not an ascendc-pack extraction marker; extract the bundle again",
                                 ".ascpack-verified", "", "extract the bundle again");
    // 2. the manifest
    Json m;
    try {
      m = detail::JsonParser(detail::read_text(dir_ + "/manifest.json", 16u << 20)).parse();
    } catch (const std::exception& e) {
      throw BundleFormatError(dir_ + "/manifest.json cannot be read (" + e.what() + "); extract the bundle again",
                              "manifest.json", "", "extract the bundle again");
    }
    if (m.type != Json::Type::Object) detail::field_error("(root)", "is not a JSON object");
    const Json* f = m.get("format");
    if (!f || !f->is_string() || f->s != "ascpack")
      throw BundleFormatError("manifest.json: field 'format' is not \"ascpack\"; this is not an ascendc-pack bundle",
                              "", "format", "pass an ascendc-pack bundle");
    const Json* ver = m.get("format_version");
    if (!ver || !ver->is_integer() || ver->i != kFormatVersion)
      throw BundleFormatError("manifest.json: field 'format_version' is not " + std::to_string(kFormatVersion) +
                                  "; upgrade the runtime (newer bundle) or rebuild the bundle (older)",
                              "", "format_version", "upgrade the runtime or rebuild the bundle");
    const Json& members = detail::need(m, "members", Json::Type::Object, "");
    const Json& target = detail::need(m, "target", Json::Type::Object, "");
    const Json& tv = detail::need(m, "torch", Json::Type::Object, "");
    const Json& graph = detail::need(m, "graph", Json::Type::Object, "");
    const Json& weights = detail::need(m, "weights", Json::Type::Object, "");
    const Json& kernels = detail::need(m, "kernels", Json::Type::Array, "");
    const Json& ins = detail::need(m, "inputs", Json::Type::Array, "");
    const Json& outs = detail::need(m, "outputs", Json::Type::Array, "");
    const Json& backend = detail::need(m, "backend", Json::Type::String, "");
    if (const Json* model = m.get("model"))
      if (const Json* n = model->get("name"); n && n->is_string()) name_ = n->s;
    for (size_t i = 0; i < ins.arr.size(); ++i) inputs_.push_back(detail::parse_spec(ins.arr[i], "inputs[" + std::to_string(i) + "]"));
    for (size_t i = 0; i < outs.arr.size(); ++i) {
      outputs_.push_back(detail::parse_spec(outs.arr[i], "outputs[" + std::to_string(i) + "]"));
      if (outputs_.back().input_index >= int64_t(inputs_.size()))
        detail::field_error("outputs[" + std::to_string(i) + "].input_index", "is not an input index");
    }
    if (const Json* mus = m.get("mutations"); mus && mus->type == Json::Type::Array)
      for (const auto& mu : mus->arr)
        if (const Json* idx = mu.get("index"); idx && idx->is_integer() && idx->i >= 0 && idx->i < int64_t(inputs_.size()))
          mutated_.push_back(idx->i);

    // 3. members: safe names, regular files, sizes (and hashes)
    for (const auto& [name, info] : members.obj) {
      if (!detail::safe_member_name(name))
        throw BundleIntegrityError("manifest.json lists the unsafe member name '" + name + "'; " + kRebuild, name, "members", kRebuild);
      const Json* size = info.get("size");
      const Json* sha = info.get("sha256");
      if (!size || !size->is_integer() || !sha || !sha->is_string())
        detail::field_error("members['" + name + "']", "needs an integer 'size' and a 'sha256'");
      std::string p = dir_ + "/" + name;
      struct stat st;
      if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
        throw BundleIntegrityError(dir_ + ": member '" + name + "' is missing or not a regular file; extract the bundle again",
                                   name, "", "extract the bundle again");
      if (int64_t(st.st_size) != size->i)
        throw BundleIntegrityError(dir_ + ": member '" + name + "' is " + std::to_string(st.st_size) + " bytes, the manifest says " +
                                       std::to_string(size->i) + "; the extraction was modified: extract the bundle again",
                                   name, "", "extract the bundle again");
      if (opt.verify_hashes && detail::sha256_file(p) != sha->s)
        throw BundleIntegrityError(dir_ + ": member '" + name + "' does not match its sha256; the extraction was modified: "
                                   "extract the bundle again", name, "", "extract the bundle again");
    }

    // 4. the host, before anything is loaded
    if (opt.check_host) {
      if (backend.s != "cpu")
        throw IncompatibleBundleError("manifest.json: field 'backend' is '" + backend.s + "'; this runtime runs 'cpu' bundles",
                                      "", "backend", "rebuild the bundle for the cpu backend");
      struct utsname u;
      std::string host_arch = ::uname(&u) == 0 ? detail::normalize_arch(u.machine) : "";
      std::string want_arch;
      if (const Json* a = target.get("arch"); a && a->is_string()) want_arch = detail::normalize_arch(a->s);
      if (!want_arch.empty() && want_arch != host_arch)
        throw IncompatibleBundleError("manifest.json: field 'target.arch': the bundle was built for " + want_arch +
                                          ", this host is " + host_arch + "; rebuild the bundle for this architecture",
                                      "", "target.arch", "rebuild the bundle for this architecture");
      std::set<std::string> flags;
      if (!want_arch.empty() && detail::host_cpu_flags(flags)) {
        std::string missing;
        if (const Json* isa = target.get("isa"); isa && isa->type == Json::Type::Array)
          for (const auto& feat : isa->arr)
            if (feat.is_string() && !flags.count(feat.s)) missing += (missing.empty() ? "" : ", ") + feat.s;
        if (!missing.empty()) {
          std::string march = "?";
          if (const Json* mj = target.get("march"); mj && mj->is_string()) march = mj->s;
          throw IncompatibleBundleError("manifest.json: field 'target.isa': the bundle's code was compiled with -march=" + march +
                                            " and needs CPU features this host lacks: " + missing +
                                            "; rebuild with a portable target, e.g. `ascendc-pack build --march x86-64-v2`",
                                        "", "target.isa", "rebuild with --march for this host");
        }
      }
      const Json& version = detail::need(tv, "version", Json::Type::String, "torch");
      std::string want = version.s.substr(0, version.s.find('+'));
      if (want != TORCH_VERSION)
        throw IncompatibleBundleError("manifest.json: field 'torch.version': graph.so was built against torch " + version.s +
                                          ", this program was compiled against libtorch " TORCH_VERSION
                                          "; use that libtorch or rebuild the bundle",
                                      "", "torch.version", "use the same libtorch or rebuild the bundle");
      if (const Json* abi = tv.get("cxx11_abi"); abi && abi->type == Json::Type::Bool && abi->b != bool(_GLIBCXX_USE_CXX11_ABI))
        throw IncompatibleBundleError("manifest.json: field 'torch.cxx11_abi': graph.so was built with _GLIBCXX_USE_CXX11_ABI=" +
                                          std::to_string(int(abi->b)) + ", this program with " +
                                          std::to_string(int(_GLIBCXX_USE_CXX11_ABI)) + "; compile it with libtorch's ABI",
                                      "", "torch.cxx11_abi", "compile with -D_GLIBCXX_USE_CXX11_ABI matching libtorch");
    }

    // 5. weights: a private copy-on-write mapping of weights.bin, zero-copy tensors over it
    const Json& wfile = detail::need(weights, "file", Json::Type::String, "weights");
    if (!members.get(wfile.s)) detail::field_error("weights.file", "is not one of the members");
    const Json& tensors = detail::need(weights, "tensors", Json::Type::Array, "weights");
    auto map = std::make_shared<detail::Mapping>();
    std::string wpath = dir_ + "/" + wfile.s;
    int fd = ::open(wpath.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw BundleIntegrityError("cannot open " + wpath + ": " + std::strerror(errno), wfile.s, "", "extract the bundle again");
    struct stat wst;
    ::fstat(fd, &wst);
    map->size = size_t(wst.st_size);
    if (map->size > 0) {
      map->addr = ::mmap(nullptr, map->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
      if (map->addr == MAP_FAILED) {
        int err = errno;
        ::close(fd);
        throw BundleLoadError("cannot map " + wpath + ": " + std::strerror(err), wfile.s, "", "check memory limits");
      }
    }
    ::close(fd);
    weights_map_ = map;
    std::vector<at::Tensor> wts;
    for (size_t i = 0; i < tensors.arr.size(); ++i) {
      std::string where = "weights.tensors[" + std::to_string(i) + "]";
      const Json& e = tensors.arr[i];
      TensorSpec spec = detail::parse_spec(e, where);
      const Json& off = detail::need(e, "offset", Json::Type::Number, where);
      const Json& nb = detail::need(e, "nbytes", Json::Type::Number, where);
      if (!off.is_int || !nb.is_int || off.i < 0 || nb.i < 0 || spec.stride.size() != spec.shape.size())
        detail::field_error(where, "has a bad offset, nbytes or stride");
      int64_t itemsize = int64_t(c10::elementSize(spec.dtype));
      bool empty = std::any_of(spec.shape.begin(), spec.shape.end(), [](int64_t s) { return s == 0; });
      int64_t span = empty ? 0 : 1;
      for (size_t d = 0; d < spec.shape.size() && !empty; ++d) span += (spec.shape[d] - 1) * spec.stride[d];
      if (nb.i != span * itemsize || off.i % itemsize != 0 || uint64_t(off.i) + uint64_t(nb.i) > map->size)
        detail::field_error(where, "does not fit " + wfile.s);
      if (nb.i == 0) {
        wts.push_back(at::empty_strided(spec.shape, spec.stride, at::TensorOptions().dtype(spec.dtype)));
        continue;
      }
      auto keep = map;
      wts.push_back(at::from_blob(static_cast<char*>(map->addr) + off.i, spec.shape, spec.stride,
                                  [keep](void*) mutable { keep.reset(); }, at::TensorOptions().dtype(spec.dtype)));
    }

    // 6. graph.so: load once per process (its TORCH_LIBRARY registers <namespace>::*)
    const Json& ns = detail::need(graph, "namespace", Json::Type::String, "graph");
    if (ns.s.rfind("ascpack_", 0) != 0 || ns.s.size() > 80 ||
        !std::all_of(ns.s.begin() + 8, ns.s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }))
      detail::field_error("graph.namespace", "is not a valid namespace");
    ns_ = ns.s;
    const Json* gabi = graph.get("abi");
    if (!gabi || !gabi->is_integer() || gabi->i != kGraphAbi)
      throw BundleLoadError("manifest.json: field 'graph.abi' is not " + std::to_string(kGraphAbi) +
                                "; rebuild the bundle or upgrade the runtime", "", "graph.abi", kRebuild);
    std::string lib = "graph.so";
    if (const Json* l = graph.get("library"); l && l->is_string()) lib = l->s;
    if (!members.get(lib)) detail::field_error("graph.library", "is not one of the members");
    {
      std::lock_guard<std::mutex> lock(detail::load_mutex());
      if (!c10::Dispatcher::singleton().findSchema({ns_ + "::run", ""})) {
        std::string path = dir_ + "/" + lib;
        void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!h) {
          const char* err = ::dlerror();
          throw BundleLoadError("cannot load " + lib + " of the bundle: " + std::string(err ? err : "unknown error") +
                                    "; it was built against torch " + detail::need(tv, "version", Json::Type::String, "torch").s,
                                lib, "", kRebuild);
        }
        // never dlclose: the dispatcher keeps pointers into the library
      }
    }
    c10::OperatorHandle init_op = detail::find_op(ns_, "init");
    c10::OperatorHandle sig_op = detail::find_op(ns_, "signature");
    run_op_ = detail::find_op(ns_, "run");
    release_op_ = detail::find_op(ns_, "release");
    // the graph's baked kernel list must be the manifest's
    torch::jit::Stack st;
    sig_op.callBoxed(&st);
    Json sig = detail::JsonParser(st.at(0).toStringRef()).parse();
    std::set<std::string> want_k, have_k;
    for (const auto& k : kernels.arr) {
      const Json* n = k.get("name");
      const Json* key = k.get("kernel_key");
      const Json* file = k.get("file");
      if (!n || !n->is_string() || !key || !key->is_string() || !file || !file->is_string() || !members.get(file->s))
        detail::field_error("kernels", "has an entry without name, kernel_key or a member file");
      want_k.insert(n->s + "|" + key->s + "|" + file->s);
    }
    if (const Json* ks = sig.get("kernels"); ks && ks->type == Json::Type::Array)
      for (const auto& k : ks->arr) {
        const Json* n = k.get("name");
        const Json* key = k.get("kernel_key");
        const Json* file = k.get("file");
        if (n && key && file) have_k.insert(n->s + "|" + key->s + "|" + file->s);
      }
    if (want_k != have_k)
      throw BundleLoadError(lib + " was built for other kernels than the manifest lists; the bundle was assembled "
                                  "from mismatched files: " + std::string(kRebuild), lib, "kernels", kRebuild);
    torch::jit::Stack ist{c10::IValue(wts), c10::IValue(dir_)};
    try {
      init_op.callBoxed(&ist);
    } catch (const std::exception& e) {
      std::string msg = e.what();
      msg = msg.substr(0, msg.find('\n'));
      throw BundleLoadError(dir_ + ": the graph refused to load: " + msg, lib, "", kRebuild);
    }
    handle_ = ist.at(0).toInt();
  }
};

}  // namespace ascendc_pack

#endif  // ASCENDC_PACK_RUNTIME_HPP
