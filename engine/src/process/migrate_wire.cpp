#include "gpuckpt/migrate_wire.h"

#include <unistd.h>

#include <cerrno>

#include "util/no_sigpipe.h"
#include "util/write_fully.h"

namespace gpuckpt::migrate_wire {

using nlohmann::json;

json receiving(json devices) {
  return {{"receiving", true}, {"devices", std::move(devices)}};
}

bool is_receiving(const json& j) {
  if (!j.is_object()) return false;
  const auto it = j.find("receiving");
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

namespace {

void write_all(int fd, std::string_view s, const std::string& what) {
  NoSigpipe nosig;  // a peer gone is an error here, not the end of gpuckpt
  if (const int err = write_fully(fd, s.data(), s.size()); err != 0)
    throw_syserr(Errc::kIo, err, what);
}

std::string string_in(const json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

void send_line(int fd, const json& j) {
  write_all(fd, j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
            "write the answer to the migration's controller");
}

void send_commit(int fd, const std::string& where) {
  write_all(fd, kCommitLine, "send the commit to " + where);
}

bool read_commit(int fd) {
  std::string line;
  char c;
  while (line.size() <= kCommitLine.size()) {
    const ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1) return false;
    line += c;
    if (c == '\n') break;
  }
  return line == kCommitLine;
}

std::optional<TargetFailure> failure_of(const json& j) {
  if (!j.is_object()) return std::nullopt;
  const auto ok = j.find("ok");
  const auto err = j.find("error");
  if ((ok != j.end() && ok->is_boolean() && ok->get<bool>()) || err == j.end() || !err->is_object())
    return std::nullopt;
  TargetFailure f;
  f.code = errc_from_name(string_in(*err, "code")).value_or(Errc::kInternal);
  f.message = string_in(*err, "message");
  return f;
}

}  // namespace gpuckpt::migrate_wire
