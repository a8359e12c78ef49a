// A pipe whose two ends are owned, both close-on-exec.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "gpuckpt/error.h"
#include "util/unique_fd.h"

namespace gpuckpt {

struct Pipe {
  UniqueFd read, write;
};

// Throws Error(kInternal) naming `what` (the pipe's use) if pipe2 fails.
inline Pipe make_pipe(const std::string& what = "pipe") {
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) throw_errno(Errc::kInternal, what);
  return Pipe{UniqueFd(ends[0]), UniqueFd(ends[1])};
}

}  // namespace gpuckpt
