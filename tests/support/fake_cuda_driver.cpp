// A stand-in for libcuda's checkpoint API, for tests on machines without a GPU. It is not a
// model of the driver's memory work: it keeps the state machine that the real driver enforces
// (running -> locked -> checkpointed -> locked -> running), the one fact that gpuckpt's plugin
// must honour to work at all (the target's restore thread must be running, not ptrace-stopped,
// while the driver moves memory), and a log of every call, so that tests can check what the
// plugin did inside a real criu. It is loaded the way the real driver is (GPUCKPT_LIBCUDA and
// GPUCKPT_LIBCUDA_PATH), into gpuckpt and into criu, and so depends on libc only.
//
// A process "has CUDA state" when one of its threads is named "cuda-restore" (that thread is
// its restore thread; tests/support/fake_cuda_worker.cpp makes one). The state of process P
// lives in the file $GPUCKPT_FAKE_CUDA_DIR/P, so that a restore (another criu) finds what the
// dump left; $GPUCKPT_FAKE_CUDA_DIR/calls.log gets one line per checkpoint call:
//
//   OP PID START_NS END_NS RESULT
//
// With $GPUCKPT_FAKE_CUDA_CHECKPOINTS_TOGETHER=N (or RESTORES), Checkpoint (Restore) waits until
// N calls of its kind have reached this process (at most $GPUCKPT_FAKE_CUDA_WAIT_MS, 20 s by
// default, then CUDA_ERROR_TIMEOUT): a plugin that works on its tasks one after the other fails,
// one that works on them together passes. $GPUCKPT_FAKE_CUDA_FAIL_CHECKPOINT=PID fails the
// checkpoint of that process with CUDA_ERROR_NOT_SUPPORTED (what the driver says of UVM memory).
#include <cuda.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

const char* state_dir() {
  const char* d = std::getenv("GPUCKPT_FAKE_CUDA_DIR");
  return d && *d ? d : nullptr;
}

long long now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

bool read_small(const char* path, char* buf, size_t size) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = ::read(fd, buf, size - 1);
  ::close(fd);
  if (n < 0) return false;
  buf[n] = '\0';
  return true;
}

// The tid of P's thread named "cuda-restore", or 0.
int restore_tid(int pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/task", pid);
  DIR* d = ::opendir(path);
  if (!d) return 0;
  int found = 0;
  while (const dirent* e = ::readdir(d)) {
    const int tid = std::atoi(e->d_name);
    if (tid <= 0) continue;
    char comm_path[96], comm[32];
    std::snprintf(comm_path, sizeof comm_path, "/proc/%d/task/%d/comm", pid, tid);
    if (read_small(comm_path, comm, sizeof comm) && std::strncmp(comm, "cuda-restore", 12) == 0) {
      found = tid;
      break;
    }
  }
  ::closedir(d);
  return found;
}

// The state letter of a thread in /proc (R, S, t, T, ...), or 0.
char thread_state(int pid, int tid) {
  char path[96], stat[512];
  std::snprintf(path, sizeof path, "/proc/%d/task/%d/stat", pid, tid);
  if (!read_small(path, stat, sizeof stat)) return 0;
  const char* close = std::strrchr(stat, ')');
  return close && close[1] == ' ' ? close[2] : 0;
}

void state_path(int pid, char* buf, size_t size) {
  std::snprintf(buf, size, "%s/%d", state_dir(), pid);
}

CUprocessState load_state(int pid) {
  char path[4096], text[16];
  state_path(pid, path, sizeof path);
  if (!read_small(path, text, sizeof text)) return CU_PROCESS_STATE_RUNNING;
  return static_cast<CUprocessState>(std::atoi(text));
}

bool save_state(int pid, CUprocessState s) {
  char path[4096], tmp[4200], text[16];
  state_path(pid, path, sizeof path);
  std::snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, static_cast<int>(::gettid()));
  const int fd = ::open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const int n = std::snprintf(text, sizeof text, "%d\n", static_cast<int>(s));
  const bool ok = ::write(fd, text, static_cast<size_t>(n)) == n;
  ::close(fd);
  return ok && ::rename(tmp, path) == 0;
}

void log_call(const char* op, int pid, long long start, CUresult r) {
  char path[4096], line[160];
  std::snprintf(path, sizeof path, "%s/calls.log", state_dir());
  const int fd = ::open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const int n = std::snprintf(line, sizeof line, "%s %d %lld %lld %d\n", op, pid, start, now_ns(),
                              static_cast<int>(r));
  if (::write(fd, line, static_cast<size_t>(n)) != n) {
    // The log is the test's evidence: a short line shows up there as a parse failure.
  }
  ::close(fd);
}

// Waits for the restore thread to run, as the real driver does (it works through that thread;
// a thread left ptrace-stopped makes the real call hang). Here it is an error after 10 s.
bool restore_thread_runs(int pid) {
  const int tid = restore_tid(pid);
  if (!tid) return false;
  const long long deadline = now_ns() + 10LL * 1000000000LL;
  for (;;) {
    const char s = thread_state(pid, tid);
    if (s == 'R' || s == 'S' || s == 'D') return true;
    if (s == 0 || now_ns() > deadline) return false;
    ::usleep(1000);
  }
}

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
int g_arrived[2];  // checkpoint, restore

// With $GPUCKPT_FAKE_CUDA_{CHECKPOINTS,RESTORES}_TOGETHER=N: true once N calls of this kind
// have arrived.
bool meet(int kind) {
  const char* t = std::getenv(kind == 0 ? "GPUCKPT_FAKE_CUDA_CHECKPOINTS_TOGETHER"
                                        : "GPUCKPT_FAKE_CUDA_RESTORES_TOGETHER");
  const int want = t ? std::atoi(t) : 0;
  if (want <= 1) return true;
  const char* w = std::getenv("GPUCKPT_FAKE_CUDA_WAIT_MS");
  const long long wait_ns = (w ? std::atoll(w) : 20000) * 1000000LL;
  timespec deadline{};
  ::clock_gettime(CLOCK_REALTIME, &deadline);
  const long long at = deadline.tv_nsec + wait_ns;
  deadline.tv_sec += static_cast<time_t>(at / 1000000000LL);
  deadline.tv_nsec = static_cast<long>(at % 1000000000LL);
  ::pthread_mutex_lock(&g_mu);
  ++g_arrived[kind];
  ::pthread_cond_broadcast(&g_cv);
  int rc = 0;
  while (g_arrived[kind] < want && rc != ETIMEDOUT)
    rc = ::pthread_cond_timedwait(&g_cv, &g_mu, &deadline);
  const bool met = g_arrived[kind] >= want;
  ::pthread_mutex_unlock(&g_mu);
  return met;
}

// One state transition: `from` -> `to`, with the call logged.
CUresult transition(const char* op, int pid, CUprocessState from, CUprocessState to,
                    bool needs_thread, int together_kind) {
  const long long start = now_ns();
  CUresult r = CUDA_SUCCESS;
  if (!state_dir())
    r = CUDA_ERROR_NOT_INITIALIZED;
  else if (!restore_tid(pid))
    r = CUDA_ERROR_NOT_INITIALIZED;  // no CUDA state: as the real driver says it
  else if (load_state(pid) != from)
    r = CUDA_ERROR_ILLEGAL_STATE;
  else if (needs_thread && !restore_thread_runs(pid))
    r = CUDA_ERROR_NOT_READY;
  else if (together_kind >= 0 && !meet(together_kind))
    r = CUDA_ERROR_TIMEOUT;
  else if (const char* f = std::getenv("GPUCKPT_FAKE_CUDA_FAIL_CHECKPOINT");
           together_kind == 0 && f && std::atoi(f) == pid)
    r = CUDA_ERROR_NOT_SUPPORTED;
  else if (!save_state(pid, to))
    r = CUDA_ERROR_OPERATING_SYSTEM;
  log_call(op, pid, start, r);
  return r;
}

constexpr unsigned char kUuid[16] = {0x6e, 0x0f, 0xa4, 0x3d, 0x51, 0x0b, 0x4c, 0x27,
                                     0x9a, 0x41, 0x0c, 0x7d, 0xa2, 0x3b, 0x8e, 0x19};

}  // namespace

extern "C" {

__attribute__((visibility("default"))) CUresult cuInit(unsigned int) {
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuDriverGetVersion(int* v) {
  *v = 13000;
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuGetErrorName(CUresult r, const char** s) {
  *s = r == CUDA_SUCCESS ? "CUDA_SUCCESS" : nullptr;
  return r == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

__attribute__((visibility("default"))) CUresult cuGetErrorString(CUresult, const char** s) {
  *s = "reported by gpuckpt's test driver";
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuDeviceGetCount(int* n) {
  *n = 1;
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *d = 0;
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuDeviceGetName(char* name, int len, CUdevice) {
  std::snprintf(name, static_cast<size_t>(len), "gpuckpt test driver");
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuDeviceGetUuid_v2(CUuuid* u, CUdevice) {
  std::memcpy(u->bytes, kUuid, sizeof kUuid);
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice) {
  *bytes = 1ull << 30;
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute,
                                                                     CUdevice) {
  *v = 0;
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuDeviceGetPCIBusId(char* id, int len, CUdevice) {
  std::snprintf(id, static_cast<size_t>(len), "0000:00:00.0");
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuCheckpointProcessGetRestoreThreadId(int pid,
                                                                                      int* tid) {
  if (!state_dir()) return CUDA_ERROR_NOT_INITIALIZED;
  *tid = restore_tid(pid);
  return *tid ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

__attribute__((visibility("default"))) CUresult cuCheckpointProcessGetState(int pid,
                                                                            CUprocessState* s) {
  if (!state_dir() || !restore_tid(pid)) return CUDA_ERROR_NOT_INITIALIZED;
  *s = load_state(pid);
  return CUDA_SUCCESS;
}

__attribute__((visibility("default"))) CUresult cuCheckpointProcessLock(int pid,
                                                                        CUcheckpointLockArgs*) {
  return transition("lock", pid, CU_PROCESS_STATE_RUNNING, CU_PROCESS_STATE_LOCKED, false, -1);
}

__attribute__((visibility("default"))) CUresult cuCheckpointProcessCheckpoint(
    int pid, CUcheckpointCheckpointArgs*) {
  return transition("checkpoint", pid, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_CHECKPOINTED, true,
                    0);
}

__attribute__((visibility("default"))) CUresult cuCheckpointProcessRestore(
    int pid, CUcheckpointRestoreArgs*) {
  return transition("restore", pid, CU_PROCESS_STATE_CHECKPOINTED, CU_PROCESS_STATE_LOCKED, true,
                    1);
}

__attribute__((visibility("default"))) CUresult cuCheckpointProcessUnlock(int pid,
                                                                          CUcheckpointUnlockArgs*) {
  return transition("unlock", pid, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_RUNNING, false, -1);
}

__attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(
    const char* symbol, void** fn, int, cuuint64_t, CUdriverProcAddressQueryResult* status) {
  struct Entry {
    const char* name;
    void* fn;
  };
  static const Entry table[] = {
      {"cuInit", reinterpret_cast<void*>(&cuInit)},
      {"cuDriverGetVersion", reinterpret_cast<void*>(&cuDriverGetVersion)},
      {"cuGetErrorName", reinterpret_cast<void*>(&cuGetErrorName)},
      {"cuGetErrorString", reinterpret_cast<void*>(&cuGetErrorString)},
      {"cuDeviceGetCount", reinterpret_cast<void*>(&cuDeviceGetCount)},
      {"cuDeviceGet", reinterpret_cast<void*>(&cuDeviceGet)},
      {"cuDeviceGetName", reinterpret_cast<void*>(&cuDeviceGetName)},
      {"cuDeviceGetUuid", reinterpret_cast<void*>(&cuDeviceGetUuid_v2)},
      {"cuDeviceTotalMem", reinterpret_cast<void*>(&cuDeviceTotalMem_v2)},
      {"cuDeviceGetAttribute", reinterpret_cast<void*>(&cuDeviceGetAttribute)},
      {"cuDeviceGetPCIBusId", reinterpret_cast<void*>(&cuDeviceGetPCIBusId)},
      {"cuCheckpointProcessGetRestoreThreadId",
       reinterpret_cast<void*>(&cuCheckpointProcessGetRestoreThreadId)},
      {"cuCheckpointProcessGetState", reinterpret_cast<void*>(&cuCheckpointProcessGetState)},
      {"cuCheckpointProcessLock", reinterpret_cast<void*>(&cuCheckpointProcessLock)},
      {"cuCheckpointProcessCheckpoint", reinterpret_cast<void*>(&cuCheckpointProcessCheckpoint)},
      {"cuCheckpointProcessRestore", reinterpret_cast<void*>(&cuCheckpointProcessRestore)},
      {"cuCheckpointProcessUnlock", reinterpret_cast<void*>(&cuCheckpointProcessUnlock)},
  };
  for (const Entry& e : table)
    if (std::strcmp(e.name, symbol) == 0) {
      *fn = e.fn;
      if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  *fn = nullptr;
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}

}  // extern "C"
