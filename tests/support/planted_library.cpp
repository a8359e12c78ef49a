// Stands in for a libcuda.so.1 that another user left in the directory root runs gpuckpt in
// (tests/library_search_test.cpp). Being loaded at all is the harm, so the constructor records
// it: it creates the file named by $GPUCKPT_PLANTED_MARKER.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

namespace {

__attribute__((constructor)) void record_that_it_was_loaded() {
  const char* marker = std::getenv("GPUCKPT_PLANTED_MARKER");
  if (!marker || !*marker) return;
  const int fd = ::open(marker, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
}

}  // namespace
