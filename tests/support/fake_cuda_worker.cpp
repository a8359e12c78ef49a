// A process tree that looks like CUDA workers to tests/support/fake_cuda_driver.cpp: each of
// its PROCS processes keeps DEVICE_FILE open (the tests' stand-in for /dev/nvidia*, named by
// GPUCKPT_PLUGIN_TEST_DEVICE_PREFIX) and has a thread named "cuda-restore", as a CUDA process
// has the driver's restore thread. The first process is the parent of the others.
//
//   gpuckpt-fake-cuda-worker DEVICE_FILE PROCS
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace {

void* restore_thread(void*) {
  for (;;) ::pause();
  return nullptr;
}

[[noreturn]] void serve() {
  pthread_t t;
  if (::pthread_create(&t, nullptr, restore_thread, nullptr) != 0) std::_Exit(3);
  ::pthread_setname_np(t, "cuda-restore");
  for (;;) ::pause();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s DEVICE_FILE PROCS\n", argv[0]);
    return 2;
  }
  if (::open(argv[1], O_RDONLY) < 0) {
    std::perror(argv[1]);
    return 1;
  }
  const int procs = std::atoi(argv[2]);
  for (int i = 1; i < procs; ++i) {
    const pid_t p = ::fork();
    if (p < 0) return 1;
    if (p == 0) serve();
  }
  serve();
}
