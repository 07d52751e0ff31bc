// ascendc_pack/rt/json.hpp - a small strict JSON reader for manifest.json and the marker
// (no dependency besides the standard library). Objects keep their key order; a duplicate key
// is refused (the Python reader refuses it too, so both readers always see the same value).
#ifndef ASCENDC_PACK_RT_JSON_HPP
#define ASCENDC_PACK_RT_JSON_HPP

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ascendc_pack {
namespace detail {

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
      std::set<std::string> keys;
      while (true) {
        ws();
        if (p_ == end_ || *p_ != '"') fail("expected a key");
        std::string key = str();
        if (!keys.insert(key).second) fail("duplicate key in an object");
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

}  // namespace detail
}  // namespace ascendc_pack

#endif  // ASCENDC_PACK_RT_JSON_HPP
