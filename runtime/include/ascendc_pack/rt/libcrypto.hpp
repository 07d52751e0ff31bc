// ascendc_pack/rt/libcrypto.hpp - the few functions of OpenSSL's libcrypto (1.1.1 or 3.x) the
// C++ API uses under a trust policy: ed25519 verification (rt/trust.hpp) and sha256 of files
// (rt/extraction.hpp: every member is hashed under a policy; libcrypto's sha256 uses the CPU's
// SHA extensions and is ~10x faster than the portable rt/sha256.hpp).
//
// Opened with dlopen() on first use, which happens only when a trust policy is set: programs
// that do not use signatures neither link nor need it (no -lcrypto, no OpenSSL headers).
#ifndef ASCENDC_PACK_RT_LIBCRYPTO_HPP
#define ASCENDC_PACK_RT_LIBCRYPTO_HPP

#include <dlfcn.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ascendc_pack {
namespace detail {

class LibCrypto {
 public:
  static const LibCrypto& get() {
    static const LibCrypto instance;
    return instance;
  }
  bool has_ed25519() const { return verify_ != nullptr; }
  bool has_sha256() const { return digest_final_ != nullptr; }

  // ed25519 over msg: 1 valid, 0 invalid, -1 error
  int verify_ed25519(const std::string& key, const std::string& sig, const std::string& msg) const {
    void* pkey = new_raw_public_(kEvpPkeyEd25519, nullptr, reinterpret_cast<const unsigned char*>(key.data()), key.size());
    if (!pkey) return -1;
    void* ctx = md_ctx_new_();
    int rc = -1;
    if (ctx && verify_init_(ctx, nullptr, nullptr, nullptr, pkey) == 1)
      rc = verify_(ctx, reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                   reinterpret_cast<const unsigned char*>(msg.data()), msg.size()) == 1 ? 1 : 0;
    if (ctx) md_ctx_free_(ctx);
    pkey_free_(pkey);
    return rc;
  }

  // Lower-case hex sha256 of everything read from fd until EOF; nullopt on a read or library error.
  std::optional<std::string> sha256_fd(int fd) const {
    void* ctx = md_ctx_new_();
    if (!ctx) return std::nullopt;
    bool ok = digest_init_(ctx, sha256_(), nullptr) == 1;
    std::vector<unsigned char> buf(1 << 20);
    while (ok) {
      ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0) ok = false;
      if (n <= 0) break;
      ok = digest_update_(ctx, buf.data(), size_t(n)) == 1;
    }
    unsigned char md[32];
    unsigned int len = 0;
    ok = ok && digest_final_(ctx, md, &len) == 1 && len == 32;
    md_ctx_free_(ctx);
    if (!ok) return std::nullopt;
    static const char* digits = "0123456789abcdef";
    std::string hex;
    for (unsigned char c : md) {
      hex += digits[c >> 4];
      hex += digits[c & 15];
    }
    return hex;
  }

 private:
  static constexpr int kEvpPkeyEd25519 = 1087;  // NID_ED25519 (OpenSSL ABI constant)
  using NewRawPub = void* (*)(int, void*, const unsigned char*, size_t);
  using CtxNew = void* (*)();
  using VerifyInit = int (*)(void*, void**, const void*, void*, void*);
  using Verify = int (*)(void*, const unsigned char*, size_t, const unsigned char*, size_t);
  using Free = void (*)(void*);
  using Md = const void* (*)();
  using DigestInit = int (*)(void*, const void*, void*);
  using DigestUpdate = int (*)(void*, const void*, size_t);
  using DigestFinal = int (*)(void*, unsigned char*, unsigned int*);
  NewRawPub new_raw_public_ = nullptr;
  CtxNew md_ctx_new_ = nullptr;
  VerifyInit verify_init_ = nullptr;
  Verify verify_ = nullptr;
  Free md_ctx_free_ = nullptr, pkey_free_ = nullptr;
  Md sha256_ = nullptr;
  DigestInit digest_init_ = nullptr;
  DigestUpdate digest_update_ = nullptr;
  DigestFinal digest_final_ = nullptr;

  template <class F>
  static F sym(void* lib, const char* name) {
    return reinterpret_cast<F>(::dlsym(lib, name));
  }

  LibCrypto() {
    void* lib = nullptr;
    for (const char* name : {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"})
      if ((lib = ::dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib) return;
    md_ctx_new_ = sym<CtxNew>(lib, "EVP_MD_CTX_new");
    md_ctx_free_ = sym<Free>(lib, "EVP_MD_CTX_free");
    if (!md_ctx_new_ || !md_ctx_free_) return;
    new_raw_public_ = sym<NewRawPub>(lib, "EVP_PKEY_new_raw_public_key");
    verify_init_ = sym<VerifyInit>(lib, "EVP_DigestVerifyInit");
    pkey_free_ = sym<Free>(lib, "EVP_PKEY_free");
    Verify v = sym<Verify>(lib, "EVP_DigestVerify");
    if (new_raw_public_ && verify_init_ && pkey_free_) verify_ = v;
    sha256_ = sym<Md>(lib, "EVP_sha256");
    digest_init_ = sym<DigestInit>(lib, "EVP_DigestInit_ex");
    digest_update_ = sym<DigestUpdate>(lib, "EVP_DigestUpdate");
    DigestFinal f = sym<DigestFinal>(lib, "EVP_DigestFinal_ex");
    if (sha256_ && digest_init_ && digest_update_) digest_final_ = f;
  }
};

}  // namespace detail
}  // namespace ascendc_pack

#endif  // ASCENDC_PACK_RT_LIBCRYPTO_HPP
