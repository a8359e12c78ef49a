// Shared test helpers: paths of the built binaries, scratch directories, running the CLI.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "gpuckpt/error.h"
#include "util/fs.h"
#include "util/subprocess.h"
#include "util/unique_fd.h"

namespace gpuckpt::test {

std::filesystem::path bin_dir();         // build/bin: gpuckpt, demo servers, kernels runner
std::filesystem::path gpuckpt_binary();  // build/bin/gpuckpt

// A fresh scratch directory under $TMPDIR (default /tmp), removed at the end of the test.
TempDir scratch_dir(const std::string& name = "gpuckpt-test");

// A small tmpfs mounted at `at` (created) for the test, unmounted at the end of its scope;
// ok() is false where mounting is not permitted (not root), why() says why.
class TmpfsMount {
 public:
  TmpfsMount(const std::filesystem::path& at, const std::string& opts);
  ~TmpfsMount();
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;
  bool ok() const { return ok_; }
  std::string why() const;

 private:
  std::filesystem::path at_;
  bool ok_ = false;
  int err_ = 0;
};

struct CliResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs build/bin/gpuckpt with `args`; never throws on a non-zero exit.
CliResult run_cli(const std::vector<std::string>& args, int timeout_s = 300);

// Starts build/bin/gpuckpt with `args`, held at its fault point `point` (util/fault.h), and
// returns once it is there. Its stdout and stderr go to DIR/cli.out and DIR/cli.err.
// `resume`: kOnInterrupt, it goes on from there once a signal's rollback has begun
// ($GPUCKPT_FAULT_RESUME=interrupt), racing the guard as an unpaused gpuckpt would;
// kWhenUnmarked, once the test calls resume_paused. `launcher`: a command line that execs
// gpuckpt (appended to it) in its own pid, such as `unshare` without --fork.
enum class Resume { kNever, kOnInterrupt, kWhenUnmarked };
Child paused_cli(const std::vector<std::string>& args, const std::string& point,
                 const std::filesystem::path& dir, Resume resume = Resume::kNever,
                 const std::vector<std::string>& launcher = {});
// gpuckpt with `args` held at `point` (paused_cli), then sent `sig`: how it ended.
ExitStatus signalled_at(const std::vector<std::string>& args, const std::string& point, int sig,
                        const std::filesystem::path& dir,
                        const std::vector<std::string>& launcher = {});
// Lets a gpuckpt that paused_cli held at `point` with Resume::kWhenUnmarked go on.
void resume_paused(const std::filesystem::path& dir, const std::string& point);

// Writes `size` bytes of deterministic content (seeded) to `path`: `random_fraction` of it
// incompressible, the rest fp16-like values (compressible, like a KV cache).
void write_test_file(const std::filesystem::path& path, std::uint64_t size, std::uint64_t seed,
                     double random_fraction = 0.5);

// True if `a` and `b` have identical bytes.
bool same_contents(const std::filesystem::path& a, const std::filesystem::path& b);

// Overwrites 64 bytes in the middle of the last chunk of a pages image of `checkpoint`, its blob's
// size unchanged: damage that only a read of that chunk finds, late in a restore. False if the
// checkpoint holds no pages image.
bool damage_last_pages_chunk(const std::filesystem::path& checkpoint);

// ---- HTTP, and the vLLM-shaped demo (tools/vllm_demo) ----

struct HttpResponse {
  int status = 0;    // e.g. 200
  std::string body;  // decoded by Content-Length, else read to EOF
};
// One HTTP/1.1 request with "Connection: close" to HOST:PORT, bounded by `timeout`; a
// non-empty body is sent as application/json. Throws Error(kProcess) if the server refuses or
// closes without an answer, Error(kTimeout) past `timeout`.
HttpResponse http_request(int port, const std::string& method, const std::string& path,
                          const std::string& body = {},
                          std::chrono::milliseconds timeout = std::chrono::seconds(60),
                          const std::string& host = "127.0.0.1");
// POSTs `json` and returns the answer's body; throws Error(kProcess) unless the status is 2xx.
std::string http_post_json(int port, const std::string& path, const std::string& json,
                           std::chrono::milliseconds timeout = std::chrono::seconds(60));
// POST /v1/completions to the vLLM demo; returns choices[0].text.
std::string vllm_complete(int port, const std::string& session, const std::string& prompt,
                          int max_tokens = 8);

struct VllmDemo {
  Child front;  // the root of the tree
  int port = 0;
  std::filesystem::path log;  // its stdout and stderr, appended (the READY line is in it)
};
// Starts build/bin/gpuckpt-vllm-demo --port 0 --port-file DIR/vllm-demo.port [args...] in its
// own session, stdin from /dev/null, output appended to DIR/vllm-demo.log (what CRIU needs),
// and waits until GET /health answers 2xx. Throws Error (quoting the log) if the demo exits
// first or `timeout` passes.
VllmDemo start_vllm_demo(const std::filesystem::path& dir,
                         const std::vector<std::string>& args = {},
                         std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Sets an environment variable (inherited by what the test starts) and puts back what was there
// when it goes.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// ---- CUDA workers for the test driver (tests/support/fake_cuda_driver.cpp) ----

// One call that the test driver logged.
struct FakeCudaCall {
  std::string op;  // lock, checkpoint, restore, unlock
  pid_t pid = 0;
  std::int64_t start_ns = 0, end_ns = 0;  // CLOCK_MONOTONIC
  int result = -1;                        // its CUresult
};

// A tree of `procs` processes (gpuckpt-fake-cuda-worker) that the test driver takes for CUDA
// workers, in its own session, started once each has its restore thread; killed and reaped
// at the end. This process becomes a child subreaper, so that it reaps the workers' orphans:
// a zombie keeps its pid, and the root's session id, taken from a restore.
class FakeCudaTree {
 public:
  explicit FakeCudaTree(int procs);
  ~FakeCudaTree();
  FakeCudaTree(const FakeCudaTree&) = delete;
  FakeCudaTree& operator=(const FakeCudaTree&) = delete;

  TempDir dir;
  Child root;
  std::vector<pid_t> pids;  // the root first

  std::filesystem::path state_dir() const { return dir.path() / "cuda"; }
  std::filesystem::path device_file() const { return dir.path() / "nvidia0"; }
  // KEY=VALUE entries that make criu's plugin, or gpuckpt (which hands the driver's path on),
  // load the test driver and take the workers for GPU holders. `together` > 0: the driver
  // holds each checkpoint and each restore until that many have arrived.
  std::vector<std::string> env(int together) const;
  // The driver's state of `pid` as the test driver keeps it (a CUprocessState).
  int cuda_state(pid_t pid) const;
  std::vector<FakeCudaCall> calls() const;

  // The tid of `pid`'s thread named cuda-restore, or 0.
  static pid_t restore_thread(pid_t pid);
  // Whether `pid`, a child of this process, ended and was reaped (within wait_until's time).
  static bool reap(pid_t pid);
};

// Pids of `root`'s live descendants (children, their children, ...), from /proc; zombies are
// left out.
std::vector<pid_t> descendants(pid_t root);

}  // namespace gpuckpt::test

namespace gpuckpt::test {

// ---- services for the end-to-end checkpoint tests ----

// Test runners hand us open files (ctest: its LastTest.log, without O_CLOEXEC). A service that
// inherits such a file cannot be restored once the file has grown (CRIU checks the size of
// files open for writing), so the suites call this first: nothing of ours is inherited.
void close_inherited_fds();

// A TCP port on 127.0.0.1 that was free a moment ago (for servers that need a number), below
// the kernel's ephemeral range where it has one, so that no connection takes it meanwhile.
int free_tcp_port();
// A unix stream socket listening on `path` (throws Error(kInternal) if it cannot).
UniqueFd unix_listener(const std::filesystem::path& path);

// crun (podman's and CRI-O's runtime on some distributions) refuses this machine's hybrid
// cgroups. `on_cgroup2(argv)` runs argv as on a host of cgroup v2 alone, crun's and gpuckpt's
// alike: in a mount namespace of its own whose /sys/fs/cgroup is the unified hierarchy.
std::vector<std::string> on_cgroup2(std::vector<std::string> argv);

// Polls `cond` (every few ms) until it holds or `timeout` passes; returns whether it held.
bool wait_until(const std::function<bool()>& cond,
                std::chrono::milliseconds timeout = std::chrono::seconds(30));

// The gpuckpt::Error that `f` throws. If it returns, or throws anything else, the test fails
// and the result is an Error of code kInternal saying so.
Error error_from(const std::function<void()>& f);

// Whether, within wait_until's time, no gpuckpt or guard holds the dump lock of process `pid`
// (in $GPUCKPT_RUN_DIR, else /run/gpuckpt): a guard that resumed the service may still be
// finishing its recovery, and a dump started meanwhile is refused as a second one.
bool wait_unlocked(pid_t pid);

// The state letter of /proc/PID/stat ('R', 'S', 'T', 'Z', ...), or 0 if there is no process.
char process_state(pid_t pid);
// Whether `pid` is, or within wait_until's timeout becomes, neither stopped nor traced ('T',
// 't'): a frozen service that a recovery resumes.
bool runs_again(pid_t pid);

// The directories that gpuckpt's container restores wrote for container `id`, under any runc
// root's directory of /run/gpuckpt/containers (none once the restore is done or undone).
std::vector<std::filesystem::path> container_restore_dirs(const std::string& id);
// Removes them (a test's teardown).
void remove_container_restore_dirs(const std::string& id);

}  // namespace gpuckpt::test

namespace gpuckpt::test {

// ---- object storage ----

// A real S3-compatible server (s3rver, installed by scripts/install-s3rver.sh; $GPUCKPT_S3RVER
// names another binary) on 127.0.0.1 and a port of its own choosing, its objects in a scratch
// directory, with `bucket` created. Stopped and removed with this object. Throws Error if the
// server is not installed or does not come up.
class NetNs;
class S3Server {
 public:
  explicit S3Server(const std::string& bucket = "ckpts");
  // The same, inside the network namespace `ns`, listening on all its addresses.
  S3Server(const std::string& bucket, const NetNs& ns);
  ~S3Server();
  S3Server(const S3Server&) = delete;
  S3Server& operator=(const S3Server&) = delete;

  std::string endpoint() const;                            // http://127.0.0.1:PORT
  std::string endpoint(const std::string& address) const;  // http://ADDRESS:PORT
  const std::string& bucket() const { return bucket_; }
  // Points gpuckpt (this process and the children it starts) at the server: AWS_ENDPOINT_URL,
  // the server's credentials and a region, with no AWS files read.
  void export_environment() const;
  void stop();  // the server ends now (a store that has gone away)

 private:
  void start(const std::vector<std::string>& prefix, const std::string& address);
  TempDir dir_;
  std::string bucket_;
  Child child_;
  int port_ = 0;
};

}  // namespace gpuckpt::test

namespace gpuckpt::test {

// ---- other hosts, on this machine ----

// A network namespace standing in for another host, made for one test and deleted with this
// object (after killing what still runs in it): only its own loopback, up.
class NetNs {
 public:
  explicit NetNs(const std::string& tag);
  ~NetNs();
  NetNs(const NetNs&) = delete;
  NetNs& operator=(const NetNs&) = delete;
  const std::string& name() const { return name_; }
  // `argv` run inside the namespace (nsenter --net=...; the mount namespace stays ours).
  std::vector<std::string> wrap(const std::vector<std::string>& argv) const;
  // Runs `fn` on a thread that has entered the namespace (network namespaces are per thread),
  // and returns its result; exceptions are rethrown here.
  template <class F>
  auto within(F&& fn) const -> decltype(fn());
  // Pids of the processes whose network namespace this is.
  std::vector<pid_t> processes() const;
  // A veth pair between this namespace and `other`, with `mine` and `theirs` ("10.x.y.z/24",
  // addresses that exist only inside the two namespaces), up on both sides.
  void link(const NetNs& other, const std::string& mine, const std::string& theirs) const;

 private:
  void enter_this_thread() const;
  std::string name_;
};

// A Kubernetes pod's namespaces: a network namespace (/run/netns/NAME, as CNI makes it) and, in
// it, a sandbox process (the pause container) holding the pod's ipc and uts namespaces, whose
// hostname is `tag`. containerd's CRI joins a pod's containers to all three by the sandbox's
// pid (/proc/PAUSE/ns/net); a container may also join the network by the bind mount.
class PodSandbox {
 public:
  explicit PodSandbox(const std::string& tag);
  const NetNs& net() const { return net_; }
  pid_t pid() const { return sandbox_.pid(); }
  std::string netns_path() const { return "/run/netns/" + net_.name(); }
  std::string ns_path(const std::string& type) const;  // /proc/PID/ns/TYPE of the sandbox
  std::string hostname() const;                        // its uts namespace's, with "\n"
  // Which of the pod's namespaces (net, ipc, uts) process `p` is not in: "" when in all three.
  std::string outside(pid_t p) const;
  // What another container of the pod keeps in its ipc namespace: a SysV segment made (its
  // id), and how many there are.
  int make_sysv_segment() const;
  std::size_t sysv_segments() const;

 private:
  NetNs net_;
  Child sandbox_;
};

// The inode of the namespace at `path` (/proc/PID/ns/TYPE, a bind mount of one); 0 if none.
std::uint64_t namespace_inode(const std::string& path);

// sshd (Debian's OpenSSH) for the host `ns`, started per connection by ssh's ProxyCommand as
// `sshd -i` inside the namespace, so it listens nowhere at all. Keys, sshd_config and an
// ssh_config naming the host `alias` live in `dir`. `proxy_prefix`, if given, is a shell
// pipeline stage put before sshd on the client's side of the connection (e.g. "dd bs=65536 count=N
// iflag=count_bytes status=none |" to cut it after N bytes; dd, which passes each read on at once).
class SshHost {
 public:
  // `env`: NAME=VALUE settings of the other host's sessions (its operator's configuration).
  SshHost(const NetNs& ns, const std::filesystem::path& dir, const std::string& alias,
          const std::string& proxy_prefix = "", const std::vector<std::string>& env = {});
  const std::filesystem::path& config() const { return config_; }
  std::string url() const { return "ssh://" + alias_; }

 private:
  std::filesystem::path config_;
  std::string alias_;
};

template <class F>
auto NetNs::within(F&& fn) const -> decltype(fn()) {
  using R = decltype(fn());
  std::exception_ptr err;
  std::optional<std::conditional_t<std::is_void_v<R>, int, R>> out;
  std::thread t([&] {
    try {
      enter_this_thread();
      if constexpr (std::is_void_v<R>) {
        fn();
        out.emplace(0);
      } else {
        out.emplace(fn());
      }
    } catch (...) {
      err = std::current_exception();
    }
  });
  t.join();
  if (err) std::rethrow_exception(err);
  if constexpr (!std::is_void_v<R>) return std::move(*out);
}

}  // namespace gpuckpt::test
