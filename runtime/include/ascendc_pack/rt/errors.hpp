// ascendc_pack/rt/errors.hpp - the C++ API's typed errors (same families as the Python
// runtime's ascendc_pack_runtime.errors). Every refusal names the member or manifest field and
// the fix; catch ascendc_pack::BundleError for all of them.
#ifndef ASCENDC_PACK_RT_ERRORS_HPP
#define ASCENDC_PACK_RT_ERRORS_HPP

#include <stdexcept>
#include <string>
#include <utility>

namespace ascendc_pack {

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
struct TrustError : BundleError { using BundleError::BundleError; };              // signature vs policy
struct CacheError : BundleError { using BundleError::BundleError; };              // unsafe / broken cache

}  // namespace ascendc_pack

#endif  // ASCENDC_PACK_RT_ERRORS_HPP
