#include "gpuckpt/error.h"

#include <cerrno>
#include <cstring>

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

void throw_errno(Errc code, const std::string& what, int err) {
  throw Error(code, what + ": " + std::strerror(err));
}

void throw_errno(Errc code, const std::string& what) {
  throw_errno(code, what, errno);
}

}  // namespace gpuckpt
