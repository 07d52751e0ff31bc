// ascendc_pack/rt/extraction.hpp - the rules an extracted bundle directory must pass before
// the C++ API loads anything from it (the Python runtime applies the same ones:
// ascendc_pack_runtime/cache_rules.py; docs/FORMAT.md, "The cache rules"). No torch here.
// "Private": owned by this user or root, not writable by group or other.
//
//  * the way to the cache (the directory holding the extraction) is resolved one component at
//    a time: every directory looked up is owned by this user or root and not writable by
//    group/other unless sticky; every symlink followed is owned by this user or root; the cache
//    itself is private (check_cache_path);
//  * the extraction is a private real directory (no symlink);
//  * the marker ".ascpack-verified" (written last by the Python runtime) names the bundle's
//    sha256 and the sha256 of manifest.json as verified from the archive, and manifest.json
//    still has that sha256;
//  * every member, manifest.json, manifest.sig and the marker is a private regular file reached
//    through private real directories, never a symlink; every member has its manifest size (and
//    sha256 with verify_hashes or a trust policy); every library is re-hashed right before it is
//    loaded;
//  * the host has the bundle's architecture and ISA features.
#ifndef ASCENDC_PACK_RT_EXTRACTION_HPP
#define ASCENDC_PACK_RT_EXTRACTION_HPP

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <limits.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "contract.hpp"
#include "errors.hpp"
#include "json.hpp"
#include "libcrypto.hpp"
#include "manifest.hpp"
#include "sha256.hpp"

namespace ascendc_pack {
namespace extraction {

inline const char* kExtractAgain = "extract the bundle again with `python -m ascendc_pack_runtime extract BUNDLE`";

inline std::string errno_text(int err) { return std::strerror(err); }

inline bool owned(const struct stat& st) { return st.st_uid == ::geteuid() || st.st_uid == 0; }

inline std::string octal_mode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%o", unsigned(mode & 07777));
  return buf;
}

// `path` (its `st`) is private; CacheError naming `what` and the fix otherwise.
inline void check_private(const std::string& path, const struct stat& st, const std::string& what,
                          const std::string& fix = "use a cache directory you own") {
  if (!owned(st))
    throw CacheError(what + " " + path + " belongs to another user (uid " + std::to_string(st.st_uid) +
                     "), who could replace the code or weights it holds; " + fix, "", "", fix);
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    throw CacheError(what + " " + path + " can be written by group or other users (mode " + octal_mode(st.st_mode) +
                     "), who could replace the code or weights it holds; run `chmod "
                     "go-w " + path + "` or " + fix, "", "", "chmod go-w " + path + " or " + fix);
}

inline std::string inside_fix(const std::string& dir) {
  return "run `chmod -R go-w " + dir + "` if you changed it yourself, else delete " + dir + " and " + kExtractAgain;
}

inline std::string dir_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

// Open a file of the extraction: a private regular file, never through a symlink (O_NOFOLLOW),
// without blocking (a FIFO put there never hangs the load). Returns the descriptor.
inline int open_private(const std::string& path, const std::string& member, struct stat& st) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    throw BundleIntegrityError("cannot open " + path + ": " + errno_text(err) + "; " + kExtractAgain, member, "",
                               kExtractAgain);
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw BundleIntegrityError(path + " is not a regular file; " + std::string(kExtractAgain), member, "",
                               kExtractAgain);
  }
  try {
    check_private(path, st, "a file of the extraction", inside_fix(dir_of(path)));
  } catch (...) {
    ::close(fd);
    throw;
  }
  return fd;
}

// Read a private regular file of the extraction of at most `limit` bytes.
inline std::string read_file(const std::string& path, int64_t limit, const std::string& member) {
  struct stat st;
  int fd = open_private(path, member, st);
  if (st.st_size > limit) {
    ::close(fd);
    throw BundleIntegrityError(path + " is larger than " + std::to_string(limit) + " bytes; " + kExtractAgain, member,
                               "", kExtractAgain);
  }
  std::string out(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n <= 0) break;
    got += size_t(n);
  }
  ::close(fd);
  if (got != out.size())
    throw BundleIntegrityError("cannot read " + path + " completely; " + kExtractAgain, member, "", kExtractAgain);
  return out;
}

// The sha256 of a private regular file of the extraction. `libcrypto`: hash with OpenSSL's
// libcrypto when it can be loaded (it is under a trust policy), else the portable rt/sha256.hpp.
inline std::string sha256_nofollow(const std::string& path, const std::string& member, bool libcrypto = false) {
  struct stat st;
  int fd = open_private(path, member, st);
  if (libcrypto && detail::LibCrypto::get().has_sha256()) {
    std::optional<std::string> hex = detail::LibCrypto::get().sha256_fd(fd);
    ::close(fd);
    if (!hex) throw BundleIntegrityError("cannot read " + path, member, "", kExtractAgain);
    return *hex;
  }
  detail::Sha256 h;
  std::vector<uint8_t> buf(1 << 20);
  while (true) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw BundleIntegrityError("cannot read " + path + ": " + errno_text(err), member, "", kExtractAgain);
    }
    if (n == 0) break;
    h.update(buf.data(), size_t(n));
  }
  ::close(fd);
  return h.hex();
}

// A directory nobody but this user (or root) can change: not a symlink, private.
inline void check_private_dir(const std::string& path, const std::string& what) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    int err = errno;
    throw BundleNotFoundError(path + ": " + errno_text(err) + "; pass a directory printed by "
                              "`python -m ascendc_pack_runtime extract BUNDLE`", "", "", "extract the bundle first");
  }
  if (S_ISLNK(st.st_mode))
    throw CacheError(what + " " + path + " is a symbolic link; the runtime loads only real directories it can trust: "
                     "use the directory itself", "", "", "pass the real directory");
  if (!S_ISDIR(st.st_mode))
    throw BundleNotFoundError(path + " is not a directory; pass a directory printed by "
                              "`python -m ascendc_pack_runtime extract BUNDLE`", "", "", "extract the bundle first");
  check_private(path, st, what, "extract the bundle into a cache of your own");
}

// The cache holding an extraction (`path`, which may be or pass through a symlink): resolved one
// component at a time like the kernel does; every directory looked up is this user's or root's
// and not writable by group/other unless sticky, every symlink followed is this user's or
// root's, and the cache itself is private. The Python runtime applies the same walk.
inline void check_cache_path(const std::string& path) {
  const std::string fix = "use a cache under directories of your own or root's (ASCENDC_PACK_RUNTIME_CACHE)";
  std::string full = path;
  if (full.empty() || full[0] != '/') {
    char cwd[PATH_MAX];
    if (!::getcwd(cwd, sizeof cwd)) throw CacheError("cannot resolve " + path + ": " + errno_text(errno), "", "", fix);
    full = std::string(cwd) + "/" + full;
  }
  std::vector<std::string> todo;  // components left, the next one last
  auto push_components = [&todo](const std::string& p) {
    std::vector<std::string> parts;
    std::stringstream ss(p);
    for (std::string c; std::getline(ss, c, '/');)
      if (!c.empty()) parts.push_back(c);
    todo.insert(todo.end(), parts.rbegin(), parts.rend());
  };
  push_components(full);
  std::string cur = "/";
  std::set<std::string> checked;
  int links = 0;
  auto fail = [&](const std::string& p, const std::string& problem) {
    throw CacheError("the runtime cache is not safe: " + p + " " + problem + "; " + fix, "", "", fix);
  };
  while (!todo.empty()) {
    std::string part = todo.back();
    todo.pop_back();
    if (part == ".") continue;
    if (part == "..") {
      cur = dir_of(cur);  // cur is a real directory: its parent was looked up on the way
      continue;
    }
    struct stat st;
    if (!checked.count(cur)) {
      if (::stat(cur.c_str(), &st) != 0) fail(cur, "cannot be read (" + errno_text(errno) + ")");
      if (!owned(st)) fail(cur, "(a directory on the way to the cache) belongs to another user (uid " +
                                    std::to_string(st.st_uid) + "), who could rename the cache");
      if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
        fail(cur, "(a directory above the cache) can be written by group or other users and is not sticky: they "
                  "could rename the cache");
      checked.insert(cur);
    }
    std::string next = (cur == "/" ? "" : cur) + "/" + part;
    if (::lstat(next.c_str(), &st) != 0)
      throw BundleNotFoundError(next + ": " + errno_text(errno) + "; pass a directory printed by "
                                "`python -m ascendc_pack_runtime extract BUNDLE`", "", "", "extract the bundle first");
    if (S_ISLNK(st.st_mode)) {
      if (!owned(st)) fail(next, "(a symbolic link on the way to the cache) belongs to another user (uid " +
                                     std::to_string(st.st_uid) + "), who could point it elsewhere");
      if (++links > 40) fail(path, "has too many levels of symbolic links");
      std::vector<char> target(PATH_MAX + 1);
      ssize_t n = ::readlink(next.c_str(), target.data(), PATH_MAX);
      if (n < 0) fail(next, "cannot be read (" + errno_text(errno) + ")");
      std::string t(target.data(), size_t(n));
      push_components(t);
      if (!t.empty() && t[0] == '/') cur = "/";
      continue;
    }
    if (!S_ISDIR(st.st_mode)) fail(next, "is not a directory");
    cur = next;
  }
  struct stat st;
  if (::stat(cur.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) fail(cur, "is not a directory");
  check_private(path, st, "the runtime cache", fix);
}

struct Marker {
  std::string bundle_sha256, manifest_sha256;
};

inline Marker read_marker(const std::string& dir) {
  std::string path = dir + "/" + kVerifiedMarker;
  detail::Json mk;
  try {  // a marker that breaks the cache rules is a CacheError: it propagates as one
    mk = detail::JsonParser(read_file(path, 1 << 16, kVerifiedMarker)).parse();
  } catch (const CacheError&) {
    throw;
  } catch (const std::exception& e) {
    throw BundleIntegrityError(dir + " is not a verified extraction (" + e.what() + "); " + kExtractAgain +
                                   " and pass the directory it prints", kVerifiedMarker, "", kExtractAgain);
  }
  auto text = [&](const char* key) -> std::string {
    const detail::Json* v = mk.get(key);
    return v && v->is_string() ? v->s : "";
  };
  const detail::Json* version = mk.get("version");
  Marker m{text("bundle_sha256"), text("manifest_sha256")};
  if (text("format") != kMarkerFormat || !version || !version->is_integer() || version->i != kMarkerVersion ||
      !contract::parse::is_hex(m.bundle_sha256, 64) || !contract::parse::is_hex(m.manifest_sha256, 64))
    throw BundleIntegrityError(path + " is not a version-" + std::to_string(kMarkerVersion) + " ascendc-pack extraction "
                               "marker naming the bundle's and the manifest's sha256; " + kExtractAgain,
                               kVerifiedMarker, "", kExtractAgain);
  return m;
}

// Every member: a private regular file reached through private real directories, of its
// manifest size (and sha256 with verify_hashes; `libcrypto`: see sha256_nofollow).
inline void check_members(const std::string& dir, const contract::Manifest& m, bool verify_hashes,
                          bool libcrypto = false) {
  std::set<std::string> dirs_ok;  // sub-directories already checked (each once: linear in the names)
  for (const auto& [name, info] : m.members) {
    for (size_t slash = name.find('/'); slash != std::string::npos; slash = name.find('/', slash + 1)) {
      std::string sub = name.substr(0, slash);
      if (dirs_ok.count(sub)) continue;
      struct stat st;
      std::string p = dir + "/" + sub;
      if (::lstat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        throw BundleIntegrityError(dir + ": '" + sub + "' is missing, a symbolic link or not a directory; the "
                                   "extraction was modified: " + kExtractAgain, name, "", kExtractAgain);
      check_private(p, st, "a directory of the extraction", inside_fix(dir));
      dirs_ok.insert(sub);
    }
    std::string p = dir + "/" + name;
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      throw BundleIntegrityError(dir + ": member '" + name + "' is missing or not a regular file (a symbolic link?); the "
                                 "extraction was modified: " + kExtractAgain, name, "", kExtractAgain);
    check_private(p, st, "a file of the extraction", inside_fix(dir));
    if (int64_t(st.st_size) != info.size)
      throw BundleIntegrityError(dir + ": member '" + name + "' is " + std::to_string(st.st_size) + " bytes, the manifest says " +
                                     std::to_string(info.size) + "; the extraction was modified: " + kExtractAgain,
                                 name, "", kExtractAgain);
    if (verify_hashes && sha256_nofollow(p, name, libcrypto) != info.sha256)
      throw BundleIntegrityError(dir + ": member '" + name + "' does not match its sha256; the extraction was modified: " +
                                     kExtractAgain, name, "", kExtractAgain);
  }
}

// Right before dlopen: a library must still have the sha256 the verified manifest names.
inline void check_library(const std::string& dir, const contract::Manifest& m, const std::string& name,
                          bool libcrypto = false) {
  const contract::Member* info = m.member(name);
  if (!info || sha256_nofollow(dir + "/" + name, name, libcrypto) != info->sha256)
    throw CacheError(dir + ": library '" + name + "' does not match the sha256 of the verified manifest; it was "
                     "modified after extraction: " + kExtractAgain, name, "", kExtractAgain);
}

inline std::string normalize_arch(std::string a) {
  std::transform(a.begin(), a.end(), a.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (a == "amd64" || a == "x64") return "x86_64";
  if (a == "arm64") return "aarch64";
  return a;
}

// This host's CPU flags ("flags" on x86, "Features" on arm in /proc/cpuinfo); nullopt when unknown.
inline std::optional<std::set<std::string>> host_cpu_flags(const std::string& cpuinfo = "/proc/cpuinfo") {
  std::ifstream in(cpuinfo);
  if (!in) return std::nullopt;
  for (std::string line; std::getline(in, line);) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    key.erase(key.find_last_not_of(" \t") + 1);
    if (key == "flags" || key == "Features") {
      std::set<std::string> out;
      std::istringstream words(line.substr(colon + 1));
      for (std::string w; words >> w;) out.insert(w);
      return out;
    }
  }
  return std::nullopt;
}

// Backend, architecture and ISA features (torch release and C++ ABI are checked by
// runtime.hpp, which knows the libtorch it was compiled against). `flags`: the host's CPU
// flags (nullopt: read /proc/cpuinfo).
inline void check_host_cpu(const contract::Manifest& m, const std::optional<std::set<std::string>>& flags) {
  if (m.backend != "cpu")
    throw IncompatibleBundleError("manifest.json: field 'backend' is '" + m.backend + "'; this runtime runs 'cpu' bundles",
                                  "", "backend", "rebuild the bundle for the cpu backend");
  struct utsname u;
  std::string host_arch = ::uname(&u) == 0 ? normalize_arch(u.machine) : "";
  std::string want_arch = normalize_arch(m.arch);
  if (!want_arch.empty() && want_arch != host_arch)
    throw IncompatibleBundleError("manifest.json: field 'target.arch': the bundle was built for " + want_arch +
                                      ", this host is " + host_arch + "; rebuild the bundle for this architecture",
                                  "", "target.arch", "rebuild the bundle for this architecture");
  if (want_arch.empty()) return;
  std::optional<std::set<std::string>> have = flags ? flags : host_cpu_flags();
  if (!have) return;
  std::string missing;
  for (const auto& feat : m.isa)
    if (!have->count(feat)) missing += (missing.empty() ? "" : ", ") + feat;
  if (!missing.empty())
    throw IncompatibleBundleError("manifest.json: field 'target.isa': the bundle's code was compiled with -march=" + m.march +
                                      " and needs CPU features this host lacks: " + missing +
                                      "; rebuild with a portable target, e.g. `ascendc-pack build --march x86-64-v2`",
                                  "", "target.isa", "rebuild with --march for this host");
}

}  // namespace extraction
}  // namespace ascendc_pack

#endif  // ASCENDC_PACK_RT_EXTRACTION_HPP
