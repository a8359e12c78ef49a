// The CUDA checkpoint API on a real CUDA process (gpuckpt-cuda-demo-server): lock, checkpoint
// (VRAM to host), restore and unlock must bring back the VRAM byte for byte, as the GPU-side
// checksum of the server shows. Needs a GPU and a driver with the checkpoint API; skips with
// the reason otherwise.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "device/cuda_checkpoint.h"
#include "gpuckpt/device.h"
#include "gpuckpt/error.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using device::CudaProcState;
using ::testing::HasSubstr;

namespace {

const fs::path kServer = test::bin_dir() / "gpuckpt-cuda-demo-server";

// A running gpuckpt-cuda-demo-server with its socket in `dir`.
class CudaDemo {
 public:
  CudaDemo(const fs::path& dir, const std::string& name, const std::string& vram_gib, int seed = 1)
      : socket_(dir / (name + ".sock")), out_(dir / (name + ".out")), err_(dir / (name + ".err")) {
    SpawnOptions o;
    o.stdout_file = out_;
    o.stderr_file = err_;
    child_ = spawn({kServer.string(), "--socket", socket_.string(), "--vram-gib", vram_gib,
                    "--seed", std::to_string(seed)},
                   o);
  }

  // "" once the server printed READY; else why not (its exit status and stderr).
  std::string wait_ready(int* exit_code) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      std::error_code ec;
      if (fs::exists(out_, ec) && read_file(out_).find("READY ") != std::string::npos) return "";
      if (auto st = child_.wait_for(std::chrono::milliseconds(50))) {
        *exit_code = st->exited ? st->code : -1;
        return "server " + st->describe() + ": " + read_file(err_);
      }
    }
    return "server printed no READY line within 120 s";
  }

  // One request on a fresh connection; "ERROR: ..." when the server does not answer.
  std::string ask(const std::string& line) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, socket_.c_str(), sizeof a.sun_path - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return "ERROR: connect: " + std::string(std::strerror(errno));
    }
    const std::string req = line + "\n";
    if (::write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
      ::close(fd);
      return "ERROR: write";
    }
    std::string out;
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 120000) <= 0) {
        out = "ERROR: no reply";
        break;
      }
      char c;
      if (::read(fd, &c, 1) != 1) {
        out = "ERROR: closed";
        break;
      }
      if (c == '\n') break;
      out += c;
    }
    ::close(fd);
    return out;
  }

  pid_t pid() const { return child_.pid(); }

 private:
  fs::path socket_, out_, err_;
  Child child_;
};

class CudaCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!device::checkpoint_api_available(&why)) GTEST_SKIP() << "needs a GPU: " << why;
    if (!fs::exists(kServer))
      GTEST_SKIP() << kServer << " was not built (nvcc missing at configure time)";
    dir_ = test::scratch_dir("gpuckpt-cuda");
  }

  // Starts a server; skips the test if the machine cannot run it (e.g. a driver older than
  // the CUDA runtime it was built with), fails on anything else.
  std::unique_ptr<CudaDemo> start(const std::string& name, int seed = 1) {
    auto d = std::make_unique<CudaDemo>(dir_.path(), name, "0.25", seed);
    int code = 0;
    const std::string why = d->wait_ready(&code);
    if (!why.empty()) {
      if (code == 7) {
        skip_reason_ = why;
        return nullptr;
      }
      ADD_FAILURE() << why;
      return nullptr;
    }
    return d;
  }

  CudaProcState state(pid_t pid) {
    const auto s = device::process_state(pid);
    EXPECT_TRUE(s.has_value()) << "process " << pid << " should be a CUDA process";
    return s.value_or(CudaProcState::kFailed);
  }

  TempDir dir_;
  std::string skip_reason_;
};

#define START_OR_SKIP(var, ...)                              \
  auto var = start(__VA_ARGS__);                             \
  if (!var) {                                                \
    if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_; \
    return;                                                  \
  }

}  // namespace

TEST_F(CudaCheckpoint, LockCheckpointRestoreUnlockKeepsVramByteForByte) {
  START_OR_SKIP(demo, "demo");
  START_OR_SKIP(reference, "reference");  // same seed and requests, never checkpointed
  for (const char* req : {"GEN hello", "GEN world", "GEN third request"})
    ASSERT_EQ(demo->ask(req), reference->ask(req));
  const std::string before = demo->ask("STATE");
  ASSERT_THAT(before, HasSubstr("OK 3 "));

  const pid_t pid = demo->pid();
  EXPECT_EQ(state(pid), CudaProcState::kRunning);
  EXPECT_GT(device::restore_thread_id(pid), 0);
  device::lock(pid, std::chrono::seconds(10));
  EXPECT_EQ(state(pid), CudaProcState::kLocked);
  device::checkpoint(pid);
  EXPECT_EQ(state(pid), CudaProcState::kCheckpointed);
  device::restore(pid, GpuMap{});
  EXPECT_EQ(state(pid), CudaProcState::kLocked);
  device::unlock(pid);
  EXPECT_EQ(state(pid), CudaProcState::kRunning);

  EXPECT_EQ(demo->ask("STATE"), before);
  // And it keeps serving exactly like a process that was never checkpointed.
  EXPECT_EQ(demo->ask("GEN after restore"), reference->ask("GEN after restore"));
}

TEST_F(CudaCheckpoint, RequestsWaitWhileLockedAndAreServedAfterUnlock) {
  START_OR_SKIP(demo, "demo");
  const std::string before = demo->ask("STATE");
  device::ProcessLock lock(demo->pid(), std::chrono::seconds(10));
  lock.checkpoint();
  // The request blocks in the server's CUDA calls until the state is back.
  auto reply = std::async(std::launch::async, [&] { return demo->ask("STATE"); });
  EXPECT_EQ(reply.wait_for(std::chrono::milliseconds(500)), std::future_status::timeout);
  lock.unlock();  // restores first: it was checkpointed
  EXPECT_EQ(reply.get(), before);
  EXPECT_EQ(state(demo->pid()), CudaProcState::kRunning);
}

TEST_F(CudaCheckpoint, ProcessLockUndoesEverythingWhenAnErrorUnwinds) {
  START_OR_SKIP(demo, "demo");
  demo->ask("GEN x");
  const std::string before = demo->ask("STATE");
  try {
    device::ProcessLock lock(demo->pid(), std::chrono::seconds(10));
    lock.checkpoint();
    EXPECT_EQ(state(demo->pid()), CudaProcState::kCheckpointed);
    throw std::runtime_error("dump failed midway");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(state(demo->pid()), CudaProcState::kRunning);
  EXPECT_EQ(demo->ask("STATE"), before);
}

TEST_F(CudaCheckpoint, WrongStatesAreClearProcessErrors) {
  START_OR_SKIP(demo, "demo");
  const pid_t pid = demo->pid();
  try {
    device::unlock(pid);
    ADD_FAILURE() << "unlocking a running process must fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kProcess);
    EXPECT_THAT(e.what(), HasSubstr("running"));
  }
  device::lock(pid, std::chrono::seconds(10));
  try {
    device::lock(pid, std::chrono::seconds(1));
    ADD_FAILURE() << "locking twice must fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kProcess);
    EXPECT_THAT(e.what(), HasSubstr("locked"));
  }
  device::unlock(pid);
  EXPECT_EQ(state(pid), CudaProcState::kRunning);
}

TEST_F(CudaCheckpoint, NonCudaMissingAndThreadIdsAreTold) {
  Child sleeper = spawn({"sleep", "60"});
  EXPECT_FALSE(device::process_state(sleeper.pid()).has_value());
  try {
    device::lock(sleeper.pid(), std::chrono::seconds(1));
    ADD_FAILURE() << "locking a non-CUDA process must fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kProcess);
    EXPECT_THAT(e.what(), HasSubstr("no CUDA context"));
  }
  try {
    device::process_state(999999999);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kProcess);
  }
  std::atomic<pid_t> tid{0};
  std::promise<void> done;
  std::thread t([&, f = done.get_future()]() mutable {
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    f.wait();
  });
  while (tid == 0 || tid == ::getpid()) std::this_thread::yield();
  try {
    device::process_state(tid.load());
    ADD_FAILURE() << "a thread id must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kProcess);
    EXPECT_THAT(e.what(), HasSubstr("thread"));
  }
  done.set_value();
  t.join();
}

TEST_F(CudaCheckpoint, CliSuspendAndResumeReportStatesAndTimings) {
  START_OR_SKIP(demo, "demo");
  const std::string before = demo->ask("STATE");
  const std::string pid = std::to_string(demo->pid());
  auto r = test::run_cli({"--json", "cuda-checkpoint", "--pid", pid, "--action", "suspend"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["state_before"], "running");
  EXPECT_EQ(j["state_after"], "checkpointed");
  // The two steps, after cuda_init (the gpuckpt process's one cuInit) when this call paid it.
  std::vector<std::string> names;
  for (const auto& st : j["timeline"]["stages"]) names.push_back(st["name"]);
  if (!names.empty() && names.front() == "cuda_init") names.erase(names.begin());
  EXPECT_EQ(names, (std::vector<std::string>{"cuda_lock", "cuda_checkpoint"}));

  r = test::run_cli({"--json", "cuda-checkpoint", "--pid", pid, "--action", "state"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["state_after"], "checkpointed");

  r = test::run_cli({"--json", "cuda-checkpoint", "--pid", pid, "--action", "resume"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["state_after"], "running");
  EXPECT_EQ(demo->ask("STATE"), before);
}

TEST_F(CudaCheckpoint, RestoreWithAnIdentityGpuMap) {
  const DeviceList devices = list_devices();
  if (!devices.driver.gpu_remap) GTEST_SKIP() << devices.driver.checkpoint_error;
  START_OR_SKIP(demo, "demo");
  const std::string before = demo->ask("STATE");
  // Every GPU onto itself: exercises the gpuPairs path on a single-GPU machine too.
  std::string spec;
  for (const auto& g : devices.gpus) spec += (spec.empty() ? "" : ",") + g.uuid + "=" + g.uuid;
  const GpuMap map = parse_gpu_map(spec);
  device::ProcessLock lock(demo->pid(), std::chrono::seconds(10));
  lock.checkpoint();
  lock.restore(map);
  lock.unlock();
  EXPECT_EQ(demo->ask("STATE"), before);
}
