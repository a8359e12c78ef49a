#include "gpuckpt/error.h"

#include <cstring>
#include <exception>

namespace gpuckpt {

namespace {

// The one table of the codes' names: what --json prints as error.code, and what a peer's
// gpuckpt (a migration's target) is read back by.
struct ErrcName {
  Errc code;
  std::string_view name;
};
constexpr ErrcName kErrcNames[] = {
    {Errc::kOk, "ok"},           {Errc::kInternal, "internal"},
    {Errc::kUsage, "usage"},     {Errc::kInvalidInput, "invalid_input"},
    {Errc::kCorrupt, "corrupt"}, {Errc::kVersion, "version"},
    {Errc::kIo, "io"},           {Errc::kNoDevice, "no_device"},
    {Errc::kDevice, "device"},   {Errc::kCriu, "criu"},
    {Errc::kProcess, "process"}, {Errc::kTimeout, "timeout"},
    {Errc::kExists, "exists"},
};

}  // namespace

std::string_view errc_name(Errc c) noexcept {
  for (const auto& e : kErrcNames)
    if (e.code == c) return e.name;
  return "unknown";
}

std::optional<Errc> errc_from_name(std::string_view name) noexcept {
  for (const auto& e : kErrcNames)
    if (e.name == name) return e.code;
  return std::nullopt;
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
