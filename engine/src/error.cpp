#include "gpuckpt/error.h"

#include <cstring>
#include <exception>

namespace gpuckpt {

std::string_view errc_name(Errc c) noexcept {
  switch (c) {
    case Errc::kOk:
      return "ok";
    case Errc::kInternal:
      return "internal";
    case Errc::kUsage:
      return "usage";
    case Errc::kInvalidInput:
      return "invalid_input";
    case Errc::kCorrupt:
      return "corrupt";
    case Errc::kVersion:
      return "version";
    case Errc::kIo:
      return "io";
    case Errc::kNoDevice:
      return "no_device";
    case Errc::kDevice:
      return "device";
    case Errc::kCriu:
      return "criu";
    case Errc::kProcess:
      return "process";
    case Errc::kTimeout:
      return "timeout";
    case Errc::kExists:
      return "exists";
  }
  return "unknown";
}

Error Error::with_context(std::string_view before, std::string_view after) const {
  std::string msg;
  msg.reserve(before.size() + std::strlen(what()) + after.size());
  msg.append(before).append(what()).append(after);
  Error e(code_, msg);
  e.cause_ = cause_;
  return e;
}

void rethrow_with_context(std::string_view before, std::string_view after) {
  try {
    throw;
  } catch (const Error& e) {
    throw e.with_context(before, after);
  } catch (const std::exception& e) {
    throw Error(Errc::kInternal, e.what()).with_context(before, after);
  } catch (...) {
    throw Error(Errc::kInternal, "unknown exception").with_context(before, after);
  }
}

namespace detail {
std::string with_strerror(std::string what, int err) {
  what += ": ";
  what += std::strerror(err);
  return what;
}
}  // namespace detail

}  // namespace gpuckpt
