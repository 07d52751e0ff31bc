// ascendc_pack/rt/trust.hpp - signed bundles in the C++ API: the trust policy and ed25519
// verification of manifest.sig over the exact bytes of manifest.json (docs/FORMAT.md,
// "Signatures"; the Python side is ascendc_pack_runtime/trust.py).
//
// Dependency: ed25519 comes from OpenSSL's libcrypto (1.1.1 or 3.x), opened with dlopen() only
// when a trust policy is set (rt/libcrypto.hpp), so programs that do not use signatures neither
// link nor need it (no -lcrypto, no OpenSSL headers). Without libcrypto a policy cannot be
// enforced: the load is refused with a TrustError that says so (never silently accepted).
#ifndef ASCENDC_PACK_RT_TRUST_HPP
#define ASCENDC_PACK_RT_TRUST_HPP

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "contract.hpp"
#include "errors.hpp"
#include "json.hpp"
#include "libcrypto.hpp"

namespace ascendc_pack {
namespace trust {

inline const char* kSignFix =
    "sign the bundle with a trusted key (`ascendc-pack sign BUNDLE --key KEY`) or trust its signer";

inline std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

inline bool hex_bytes(const std::string& hex, size_t n, std::string& out) {
  if (hex.size() != 2 * n) return false;
  out.clear();
  for (size_t k = 0; k < hex.size(); k += 2) {
    auto nib = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    int hi = nib(hex[k]), lo = nib(hex[k + 1]);
    if (hi < 0 || lo < 0) return false;
    out += char(hi * 16 + lo);
  }
  return true;
}

// "ed25519:<64 hex>" -> 32 raw bytes; nullopt when the text is not a key.
inline std::optional<std::string> parse_key(const std::string& text) {
  std::string t = trim(text), raw;
  if (t.rfind("ed25519:", 0) != 0 || !hex_bytes(t.substr(8), 32, raw)) return std::nullopt;
  return raw;
}

[[noreturn]] inline void policy_error(const std::string& msg) {
  throw TrustError(msg + "; fix the trust policy (LoadOptions::trusted_keys or " + kTrustedKeysEnv + ")", "",
                   kTrustedKeysEnv, "pass public keys as ed25519:<hex> or .pub files");
}

// The text of key file `path`: a regular file of at most kMaxKeyFileBytes, opened without
// blocking (a FIFO never hangs the load); TrustError otherwise.
inline std::string read_key_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    policy_error("trusted key '" + path.substr(0, 200) + "' is neither 'ed25519:<hex>' nor a readable key file (" +
                 std::strerror(err) + ")");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    policy_error("trusted key file " + path.substr(0, 200) + " is not a regular file (a directory, device, FIFO or "
                 "socket); a key file holds lines 'ed25519:<hex>'");
  }
  std::string text;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || int64_t(text.size()) + n > kMaxKeyFileBytes) {
      ::close(fd);
      policy_error("trusted key file " + path.substr(0, 200) + (n < 0 ? " cannot be read" : " is larger than " +
                   std::to_string(kMaxKeyFileBytes) + " bytes") + "; a key file holds lines 'ed25519:<hex>'");
    }
    text.append(buf, size_t(n));
  }
  ::close(fd);
  return text;
}

// The keys of one policy entry: a key text, or a file of key lines ('#' comments allowed).
inline void add_entry(const std::string& entry, std::set<std::string>& keys) {
  if (trim(entry).empty()) policy_error("a trusted key is an empty string");
  if (auto k = parse_key(entry)) {
    keys.insert(*k);
    return;
  }
  std::stringstream in(read_key_file(trim(entry)));
  size_t found = 0;
  for (std::string line; std::getline(in, line);) {
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    auto k = parse_key(line);
    if (!k) policy_error(trim(entry) + ": '" + line.substr(0, 80) + "' is not a public key 'ed25519:<hex>'");
    keys.insert(*k);
    ++found;
  }
  if (!found) policy_error("key file " + trim(entry) + " holds no public key");
}

// The policy: `explicit_keys` when given (an empty list trusts nothing), else the environment
// variable (','-separated: ':' is part of a key; empty items skipped) when set, else nullopt
// (no policy). Only an unset variable means no policy: set but naming no key ("", spaces, ",":
// what KEYS=$UNSET writes) is a TrustError, never a silent "no policy".
inline std::optional<std::set<std::string>> resolve_policy(const std::optional<std::vector<std::string>>& explicit_keys) {
  std::vector<std::string> entries;
  if (explicit_keys) {
    entries = *explicit_keys;
  } else {
    const char* env = std::getenv(kTrustedKeysEnv);
    if (!env) return std::nullopt;
    std::stringstream ss(env);
    for (std::string e; std::getline(ss, e, ',');)
      if (!trim(e).empty()) entries.push_back(e);
    if (entries.empty())
      throw TrustError(std::string(kTrustedKeysEnv) + " is set but names no key ('" + std::string(env).substr(0, 40) +
                           "'); an empty trust policy is refused rather than taken as no policy: list the trusted "
                           "public keys in it (ed25519:<hex> or .pub files, comma-separated), or unset it to load "
                           "without a trust policy", "", kTrustedKeysEnv, "list trusted keys or unset the variable");
  }
  std::set<std::string> keys;
  for (const auto& e : entries) add_entry(e, keys);
  return keys;
}

// Enforce `policy` on manifest bytes and the content of manifest.sig (nullopt: unsigned).
// Returns the signer's raw public key.
inline std::string check_signature(const std::string& manifest, const std::optional<std::string>& sig_text,
                                   const std::set<std::string>& policy, const std::string& where) {
  if (!sig_text)
    throw TrustError(where + " is not signed (no manifest.sig) and a trust policy is set; refusing to load it: " + kSignFix +
                         " (if the bundle is signed and manifest.sig was deleted from the cache, `python -m "
                         "ascendc_pack_runtime extract BUNDLE` restores it)",
                     kSignatureName, "", kSignFix);
  detail::Json doc;
  try {
    doc = detail::JsonParser(*sig_text).parse();
  } catch (const std::exception& e) {
    throw TrustError(where + "/manifest.sig is not valid JSON (" + e.what() + "): " + kSignFix, kSignatureName, "", kSignFix);
  }
  auto text = [&](const char* key) -> std::string {
    const detail::Json* v = doc.get(key);
    return v && v->is_string() ? v->s : "";
  };
  const detail::Json* version = doc.get("version");
  auto key = parse_key(text("public_key"));
  std::string sig;
  if (text("format") != "ascpack-signature" || !version || !version->is_integer() || version->i != 1 ||
      text("algorithm") != "ed25519" || !key || !hex_bytes(text("signature"), 64, sig))
    throw TrustError(where + "/manifest.sig is not an ed25519 signature of the format 'ascpack-signature' version 1: " +
                         kSignFix, kSignatureName, "", kSignFix);
  if (!policy.count(*key))
    throw TrustError(where + " is signed by a key the trust policy does not list (public key " + text("public_key") +
                         "); refusing to load it: " + kSignFix, kSignatureName, "", kSignFix);
  const detail::LibCrypto& ed = detail::LibCrypto::get();
  if (!ed.has_ed25519())
    throw TrustError("a trust policy is set but libcrypto (OpenSSL 1.1.1 or 3) cannot be loaded to verify ed25519 "
                     "signatures; install OpenSSL's libcrypto", kSignatureName, "", "install libcrypto");
  int rc = ed.verify_ed25519(*key, sig, manifest);
  if (rc != 1)
    throw TrustError(where + ": the ed25519 signature does not match manifest.json (the manifest was changed after "
                         "signing); refusing to load it: " + kSignFix, kSignatureName, "", kSignFix);
  return *key;
}

}  // namespace trust
}  // namespace ascendc_pack

#endif  // ASCENDC_PACK_RT_TRUST_HPP
