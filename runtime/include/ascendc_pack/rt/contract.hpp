// ascendc_pack/rt/contract.hpp - the constants of the bundle contract the C++ reader needs.
//
// The Python runtime's `ascendc_pack_runtime/constants.py` is the one source of these values;
// C++ cannot import it, so they are repeated here and tests/test_contract.py compiles this
// header (it needs no torch) and checks every value against the Python one. Change both.
#ifndef ASCENDC_PACK_RT_CONTRACT_HPP
#define ASCENDC_PACK_RT_CONTRACT_HPP

#include <cstdint>

namespace ascendc_pack {

constexpr int kFormatVersion = 1;          // constants.FORMAT_VERSION
constexpr int64_t kGraphAbi = 1;           // constants.GRAPH_ABI_VERSION
inline constexpr const char* kFormatName = "ascpack";                 // FORMAT_NAME
inline constexpr const char* kManifestName = "manifest.json";         // MANIFEST_NAME
inline constexpr const char* kSignatureName = "manifest.sig";         // SIGNATURE_NAME
inline constexpr const char* kVerifiedMarker = ".ascpack-verified";   // VERIFIED_MARKER
inline constexpr const char* kMarkerFormat = "ascpack-extracted";     // MARKER_FORMAT
constexpr int kMarkerVersion = 2;                                     // MARKER_VERSION
constexpr int64_t kMaxDim = int64_t(1) << 48;             // MAX_DIM: dims, strides, indices < this
constexpr int kMaxNdim = 64;                               // MAX_NDIM
constexpr int64_t kMaxMemberBytes = int64_t(1) << 62;     // MAX_MEMBER_BYTES
constexpr int64_t kMaxManifestBytes = int64_t(16) << 20;  // MAX_MANIFEST_BYTES
constexpr int64_t kMaxMembers = 100000;                   // MAX_MEMBERS
constexpr int64_t kMaxNameChars = 4096;                   // MAX_NAME_CHARS
constexpr int64_t kMaxComponentChars = 255;               // MAX_COMPONENT_CHARS
constexpr int64_t kMaxKeyFileBytes = int64_t(1) << 20;    // MAX_KEY_FILE_BYTES
inline constexpr const char* kTrustedKeysEnv = "ASCENDC_PACK_RUNTIME_TRUSTED_KEYS";  // TRUSTED_KEYS_ENV
inline constexpr const char* kRebuild = "rebuild the bundle with `ascendc-pack build`";  // REBUILD

// dtype name -> bytes per element (tensor_meta.DTYPES; itemsize of each)
struct DtypeInfo {
  const char* name;
  int64_t itemsize;
};
inline constexpr DtypeInfo kDtypes[] = {
    {"float32", 4}, {"float64", 8}, {"float16", 2}, {"bfloat16", 2}, {"int8", 1},     {"uint8", 1},
    {"int16", 2},   {"int32", 4},   {"int64", 8},   {"bool", 1},     {"complex64", 8}, {"complex128", 16}};

}  // namespace ascendc_pack

#endif  // ASCENDC_PACK_RT_CONTRACT_HPP
