// Readiness probe internals shared by the engine (restore, migrate, the cold-start benchmark).
// The public entry points, parse_probe() and wait_ready(), are declared in gpuckpt/process.h.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>

#include "gpuckpt/process.h"

namespace gpuckpt {

// Reads `fd` (e.g. a child's stdout pipe) until a line containing `text` appears and returns
// that line without its newline; a partial last line counts too, so a prompt without '\n'
// matches. Bytes read past the match are consumed and discarded. Throws Error(kTimeout) past
// `timeout`, Error(kProcess) when the writer closes the pipe first.
std::string wait_for_line(int fd, const std::string& text, std::chrono::milliseconds timeout);

// One request line to a unix stream socket and its reply line (without the newline), within
// `timeout`; "" if nothing listens or no reply comes. For line-protocol services (the demo
// servers), in benchmarks and tests.
std::string ask_unix_line(const std::filesystem::path& socket, const std::string& line,
                          std::chrono::milliseconds timeout = std::chrono::seconds(30));

// wait_ready() that calls `between_attempts` after each failed attempt; it may throw to give up
// early (e.g. when the service being probed has exited, there is no point polling on).
std::string wait_ready(const ReadinessProbe& probe, const std::function<void()>& between_attempts);

// Throws Error(kUsage) for a stdout probe: it can only watch a process gpuckpt starts itself,
// not a restored one. Restore and migrate call it before they touch anything.
void require_socket_probe(const ReadinessProbe& probe);

}  // namespace gpuckpt
