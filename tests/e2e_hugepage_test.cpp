// The huge-page fill of gpuckpt's CRIU build (docs/CRIU.md, "Huge-page fill"), end to end with
// real CRIU: a process with a dense and a sparse private anonymous region comes back with the
// dense one in transparent huge pages, the sparse one as it was (no memory added), the same
// address space as a 4 KiB restore (--no-huge-pages), and every byte of both regions intact.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <thread>

#include "probe/probe.h"
#include "process/proc_info.h"
#include "test_support.h"
#include "util/fs.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using nlohmann::json;

namespace {

constexpr std::uint64_t kDenseMiB = 192, kSparseMiB = 256;

// python3 (stdlib only): a dense region with every page written, a sparse one with one page in
// each 2 MiB written, both MAP_PRIVATE|MAP_ANONYMOUS; "HASH" answers the SHA-256 of the dense
// region and of what was written in the sparse one. It reads no other page of the sparse region:
// some kernels (this machine's 6.18.44 build) give a read fault of anonymous memory a page of
// its own rather than the zero page, and a whole read would make the region dense. The
// sparse one is MAP_NORESERVE (0x4000 on x86-64; Python 3.11 lacks the name), as sparse
// allocations often are, unless a fourth argument says "merged": two plain anonymous mappings
// side by side are one VMA on this kernel (6.18.44), which the fill's 1/32 rule then declines
// as a whole (docs/CRIU.md).
const char* kTarget = R"(import hashlib, mmap, os, socket, sys
merged = len(sys.argv) > 4 and sys.argv[4] == "merged"
dense = mmap.mmap(-1, int(sys.argv[2]) << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
sparse = mmap.mmap(-1, int(sys.argv[3]) << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS |
                   (0 if merged else getattr(mmap, "MAP_NORESERVE", 0x4000)))
block = hashlib.sha256(b"gpuckpt").digest() * 128
for off in range(0, len(dense), len(block)):
    dense[off:off + len(block)] = bytes(b ^ (off >> 12 & 0xff) for b in block[:64]) + block[64:]
for off in range(0, len(sparse), 2 << 20):
    sparse[off:off + 8] = off.to_bytes(8, "little")
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(4)
print("READY", flush=True)
while True:
    c, _ = s.accept()
    if c.recv(64).strip() == b"HASH":
        written = b"".join(sparse[off:off + 8] for off in range(0, len(sparse), 2 << 20))
        c.sendall(hashlib.sha256(dense[:] + written).hexdigest().encode() + b"\n")
    c.close()
)";

// A tree: a small parent and a child whose dense region the restore fills in parallel
// (docs/CRIU.md, "Parallel fill"); the child answers "HASH" (of its region) and prints
// "READY <pid>". With a third argument "cow" the parent fills the region before the fork and the
// child inherits it (COW), writing one page in every 2 MiB of it: the child's image then holds
// every page of the region, each compared at restore with the parent's and written only where it
// differs.
const char* kTree = R"(import hashlib, mmap, os, signal, socket, sys
cow = len(sys.argv) > 3 and sys.argv[3] == "cow"
def filled(tag):
    m = mmap.mmap(-1, int(sys.argv[2]) << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    block = hashlib.sha256(tag).digest() * 128
    for off in range(0, len(m), len(block)):
        m[off:off + len(block)] = bytes([off >> 12 & 0xff]) + block[1:]
    return m
inherited = filled(b"cow") if cow else None
if os.fork() == 0:
    dense = inherited if cow else filled(b"tree")
    if cow:
        for off in range(0, len(dense), 2 << 20):
            dense[off:off + 8] = b"child!!!"
    s = socket.socket(socket.AF_UNIX)
    s.bind(sys.argv[1])
    s.listen(4)
    print("READY", os.getpid(), flush=True)
    while True:
        c, _ = s.accept()
        if c.recv(64).strip() == b"HASH":
            c.sendall(hashlib.sha256(dense[:]).hexdigest().encode() + b"\n")
        c.close()
while True:
    signal.pause()
)";

// The signal lines of /proc/PID/status: which signals are caught, ignored and blocked.
std::string signal_actions(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string out;
  for (std::string line; std::getline(in, line);)
    if (line.rfind("SigCgt:", 0) == 0 || line.rfind("SigIgn:", 0) == 0 ||
        line.rfind("SigBlk:", 0) == 0)
      out += line + "\n";
  return out;
}

std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  const std::smatch m = [&] {
    std::smatch r;
    std::regex_search(line, r, std::regex(R"(\[(\w+)\])"));
    return r;
  }();
  return m.size() > 1 ? m[1].str() : "";
}

std::uint64_t rss_bytes(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) << 10;
  return 0;
}

// Address ranges and permissions: what a restore must give back, whatever its page size.
std::string layout(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  std::string out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string range, perms;
    f >> range >> perms;
    out += range + " " + perms + "\n";
  }
  return out;
}

json run_json(const std::vector<std::string>& args) {
  const test::CliResult r = test::run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  try {
    return json::parse(r.out);
  } catch (const json::exception&) {
    ADD_FAILURE() << "not JSON: " << r.out << r.err;
    return json::object();
  }
}

void end(pid_t pid) {
  ::kill(pid, SIGKILL);
  test::wait_until([&] { return !process::alive(pid); }, std::chrono::seconds(10));
}

// Ends a restored process however the test leaves it (a failed ASSERT returns early).
struct Ended {
  pid_t pid;
  ~Ended() { now(); }
  void now() {
    if (pid > 0) end(pid);
    pid = 0;  // its number may name another process from here on
  }
};

class HugePageFill : public ::testing::Test {
 protected:
  void SetUp() override {
    test::close_inherited_fds();
    std::ofstream(dir_.path() / "target.py") << kTarget;
  }
  // Starts kTarget (SOCK DENSE SPARSE, then `extra`) in a session of its own (no terminal: CRIU
  // dumps it without --shell-job), and waits until it is ready.
  ::testing::AssertionResult start_target(Child& c, const std::vector<std::string>& extra = {}) {
    SpawnOptions so;
    so.stdout_file = dir_.path() / "target.out";
    so.stderr_file = dir_.path() / "target.err";
    so.new_session = true;
    std::vector<std::string> argv{"python3", (dir_.path() / "target.py").string(), sock_.string(),
                                  std::to_string(kDenseMiB), std::to_string(kSparseMiB)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    c = spawn(argv, so);
    if (test::wait_until([&] { return read_file(so.stdout_file).rfind("READY", 0) == 0; },
                         std::chrono::seconds(60)))
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "the target never got ready: " << read_file(so.stderr_file);
  }
  // Starts kTree (SOCK DENSE, then `mode`) in a session of its own and waits for its child's
  // "READY <pid>" line; `child` is that pid.
  ::testing::AssertionResult start_tree(const std::string& mode, Child& root, pid_t& child) {
    const std::string name = "tree" + mode;
    const fs::path script = dir_.path() / (name + ".py");
    std::ofstream(script) << kTree;
    SpawnOptions so;
    so.stdout_file = dir_.path() / (name + ".out");
    so.stderr_file = dir_.path() / (name + ".err");
    so.new_session = true;
    root = spawn({"python3", script.string(), sock_.string(), std::to_string(kDenseMiB), mode}, so);
    // Python may write "READY" and its pid in two writes: wait for the whole line.
    if (!test::wait_until(
            [&] {
              const std::string out = read_file(so.stdout_file);
              return out.rfind("READY ", 0) == 0 && out.find('\n') != std::string::npos;
            },
            std::chrono::seconds(60)))
      return ::testing::AssertionFailure()
             << "the tree never got ready: " << read_file(so.stderr_file);
    child = std::stoi(read_file(so.stdout_file).substr(6));
    return ::testing::AssertionSuccess();
  }
  // Dumps `target` to ckpt_; the dump ends it.
  ::testing::AssertionResult dump(Child& target) {
    const json d =
        run_json({"--json", "dump", "--pid", std::to_string(target.pid()), "-o", ckpt_.string()});
    target.wait();
    if (d.value("ok", false)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "the dump failed: " << d.dump();
  }
  // Restores ckpt_ (with `extra` options) until the copy answers on the socket.
  json restore(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args{"--json", "restore", ckpt_.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--probe", "unix:" + sock_.string()});
    return run_json(args);
  }
  TempDir dir_ = test::scratch_dir("gpuckpt-hugepage");
  fs::path sock_ = dir_.path() / "t.sock";
  fs::path ckpt_ = dir_.path() / "c.ckpt";
};

TEST_F(HugePageFill, DenseMemoryComesBackInHugePagesAndSparseMemoryAddsNothing) {
  const std::string mode = thp_mode();
  if (mode != "madvise" && mode != "always")
    GTEST_SKIP() << "transparent huge pages are '" << mode << "' on this kernel";

  Child target;
  ASSERT_TRUE(start_target(target));
  const std::string hash = ask_unix_line(sock_, "HASH");
  const std::uint64_t rss_before = rss_bytes(target.pid());
  ASSERT_GT(rss_before, kDenseMiB << 20);
  ASSERT_TRUE(dump(target));

  // 4 KiB pages, as upstream CRIU restores them.
  json plain = restore({"--no-huge-pages"});
  ASSERT_EQ(plain.value("ok", false), true);
  Ended p1{plain["pid"].get<pid_t>()};
  EXPECT_EQ(plain["huge_page_bytes"].get<std::uint64_t>(), 0u);
  EXPECT_EQ(ask_unix_line(sock_, "HASH"), hash);
  const std::string plain_layout = layout(p1.pid);
  p1.now();

  // The default: the dense region in huge pages.
  json huge = restore();
  ASSERT_EQ(huge.value("ok", false), true);
  Ended p2{huge["pid"].get<pid_t>()};
  EXPECT_EQ(ask_unix_line(sock_, "HASH"), hash) << "the restored memory differs";
  EXPECT_GE(huge["huge_page_bytes"].get<std::uint64_t>(), (kDenseMiB - 4) << 20)
      << "the dense region was not filled with huge pages";
  EXPECT_EQ(layout(p2.pid), plain_layout) << "the address space differs from a 4 KiB restore";
  // The fill is timed as a stage of its own: how fast this restore met its memory. Its helper
  // threads (half the CPUs) need 2 CPUs; a read that ends first stops them early, so the bytes
  // are at most the process's memory, not all of the dense region.
  const json* fill = nullptr;
  for (const auto& s : huge["timeline"]["stages"])
    if (s["name"] == "memory_fill") fill = &s;
  if (std::thread::hardware_concurrency() >= 2) {
    ASSERT_NE(fill, nullptr) << huge["timeline"].dump();
    EXPECT_LE((*fill)["bytes"].get<std::uint64_t>(), (kDenseMiB + kSparseMiB + 64) << 20);
  }
  // A huge page per touched 2 MiB of the sparse region would add about kSparseMiB.
  EXPECT_LT(rss_bytes(p2.pid), rss_before + (32u << 20))
      << "RSS before " << (rss_before >> 20) << " MiB, after " << (rss_bytes(p2.pid) >> 20)
      << " MiB";
}

// A VMA the fill declines (here a dense region and a sparse one merged into one VMA, whose huge
// pages would add the sparse part's 2 MiB blocks) comes back in 4 KiB pages, as upstream reads
// it; its present pages are still populated by the helper threads, ahead of the read, and with
// no memory added. Before, only the fill's own VMAs were: a declined one was read serially.
TEST_F(HugePageFill, AVmaTheFillDeclinesIsStillPopulatedInParallelAndGainsNoMemory) {
  const std::string mode = thp_mode();
  if (mode != "madvise")
    GTEST_SKIP() << "transparent huge pages are '" << mode << "', not 'madvise', on this kernel";
  if (std::thread::hardware_concurrency() < 2)
    GTEST_SKIP() << "the populate threads (half the CPUs) need 2 CPUs";
  Child target;
  ASSERT_TRUE(start_target(target, {"merged"}));
  // The Rss of the VMA that holds both regions; nullopt if none does (another kernel may keep
  // them apart). The zero pages that reading the sparse part maps do not count.
  const auto merged_rss = [](pid_t p) -> std::optional<std::uint64_t> {
    std::ifstream in("/proc/" + std::to_string(p) + "/smaps");
    bool in_it = false;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("Size:", 0) == 0)
        in_it = std::stoull(line.substr(5)) >= ((kDenseMiB + kSparseMiB) << 10);
      else if (in_it && line.rfind("Rss:", 0) == 0)
        return std::stoull(line.substr(4)) << 10;
    }
    return std::nullopt;
  };
  if (!merged_rss(target.pid()))
    GTEST_SKIP() << "this kernel keeps the two mappings in VMAs of their own";
  const std::string hash = ask_unix_line(sock_, "HASH");
  ASSERT_TRUE(dump(target));

  json plain = restore({"--no-huge-pages"});
  ASSERT_EQ(plain.value("ok", false), true);
  Ended p1{plain["pid"].get<pid_t>()};
  EXPECT_EQ(ask_unix_line(sock_, "HASH"), hash);
  const std::uint64_t rss_plain = rss_bytes(p1.pid);
  const auto vma_plain = merged_rss(p1.pid);
  const std::string plain_layout = layout(p1.pid);
  p1.now();

  json r = restore();
  ASSERT_EQ(r.value("ok", false), true);
  const Ended p2{r["pid"].get<pid_t>()};
  EXPECT_EQ(ask_unix_line(sock_, "HASH"), hash) << "the restored memory differs";
  EXPECT_LT(r["huge_page_bytes"].get<std::uint64_t>(), 8u << 20) << "the fill took the VMA";
  EXPECT_EQ(layout(p2.pid), plain_layout);
  const json* fill = nullptr;
  for (const auto& s : r["timeline"]["stages"])
    if (s["name"] == "memory_fill") fill = &s;
  ASSERT_NE(fill, nullptr) << "no populate threads ran: " << r["timeline"].dump();
  EXPECT_GT((*fill)["bytes"].get<std::uint64_t>(), 0u);
  // Exactly the pages the read wrote, in the declined VMA; and nothing much anywhere else.
  ASSERT_TRUE(vma_plain.has_value());
  EXPECT_EQ(merged_rss(p2.pid), vma_plain);
  EXPECT_LT(rss_bytes(p2.pid), rss_plain + (16u << 20))
      << "RSS after a 4 KiB restore " << (rss_plain >> 20) << " MiB, after this one "
      << (rss_bytes(p2.pid) >> 20) << " MiB";
}

// The parallel copy (docs/CRIU.md, "Parallel copy"; scripts/criu-patches/0004): the dense region
// comes back byte for byte, into the same address space, whether its image came as one stream or
// as three read side by side; a restore that asks for one stream copies none in parallel.
TEST_F(HugePageFill, APagesImageCopiedAsSeveralStreamsComesBackByteForByte) {
  Child target;
  ASSERT_TRUE(start_target(target));
  const std::string hash = ask_unix_line(sock_, "HASH");
  ASSERT_TRUE(dump(target));
  auto copy_stage = [](const json& r) -> const json* {
    for (const auto& s : r["timeline"]["stages"])
      if (s["name"] == "memory_copy") return &s;
    return nullptr;
  };

  std::string one_layout;
  {
    json r = restore({"--copy-streams", "1"});
    ASSERT_EQ(r.value("ok", false), true);
    Ended p{r["pid"].get<pid_t>()};
    EXPECT_EQ(ask_unix_line(sock_, "HASH"), hash);
    EXPECT_EQ(copy_stage(r), nullptr) << "one stream was asked for";
    one_layout = layout(p.pid);
  }
  json r = restore({"--copy-streams", "3"});
  ASSERT_EQ(r.value("ok", false), true);
  const Ended p{r["pid"].get<pid_t>()};
  EXPECT_EQ(ask_unix_line(sock_, "HASH"), hash) << "the restored memory differs";
  EXPECT_EQ(layout(p.pid), one_layout);
  const json* copy = copy_stage(r);
  ASSERT_NE(copy, nullptr) << "the image came as one stream: " << r["timeline"].dump();
  // Every page of the image: the dense region, and the sparse one's written pages.
  EXPECT_GE((*copy)["bytes"].get<std::uint64_t>(), kDenseMiB << 20);
  EXPECT_EQ(r.value("staging_mode", ""), "stream");
}

}  // namespace

namespace {

// A child's image that holds its parent's pages (COW), copied by three streams: each page is
// compared with the parent's by whichever thread reads it, so the child gets back what it had
// written and still shares the rest with its parent.
TEST_F(HugePageFill, AChildsCowPagesCopiedAsSeveralStreamsStaySharedWithItsParent) {
  Child root;
  pid_t child = 0;
  ASSERT_TRUE(start_tree("cow", root, child));
  const std::string hash = ask_unix_line(sock_, "HASH");
  // The child's Shared_Dirty in the region's VMA: the parent's pages it still shares.
  const auto shared_kib = [](pid_t p) -> std::uint64_t {
    std::ifstream in("/proc/" + std::to_string(p) + "/smaps");
    bool in_it = false;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("Size:", 0) == 0)
        in_it = std::stoull(line.substr(5)) == (kDenseMiB << 10);
      else if (in_it && line.rfind("Shared_Dirty:", 0) == 0)
        return std::stoull(line.substr(13));
    }
    return 0;
  };
  const std::uint64_t before = shared_kib(child);
  ASSERT_GT(before, (kDenseMiB - 8) << 10) << "the child does not share the region";

  const fs::path ckpt = dir_.path() / "cow.ckpt";
  json d = run_json({"--json", "dump", "--pid", std::to_string(root.pid()), "-o", ckpt.string()});
  ASSERT_EQ(d.value("ok", false), true);
  root.wait();
  test::wait_until([&] { return !process::alive(child); }, std::chrono::seconds(10));
  json r = run_json({"--json", "restore", ckpt.string(), "--copy-streams", "3", "--probe",
                     "unix:" + sock_.string()});
  ASSERT_EQ(r.value("ok", false), true);
  const Ended restored{r["pid"].get<pid_t>()}, restored_child{child};
  EXPECT_EQ(ask_unix_line(sock_, "HASH"), hash) << "the child's memory differs";
  std::uint64_t copied = 0;
  for (const auto& st : r["timeline"]["stages"])
    if (st["name"] == "memory_copy") copied = st["bytes"].get<std::uint64_t>();
  // The parent's image and the child's, each in streams.
  EXPECT_GE(copied, 2 * (kDenseMiB << 20)) << r["timeline"].dump();
  EXPECT_GE(shared_kib(child), before - (4u << 10)) << "the child no longer shares the region";
}

TEST_F(HugePageFill, AChildFilledInParallelKeepsItsMemoryAndItsSignalActions) {
  // The fill's threads must leave nothing behind: glibc installs handlers for its own signals
  // (32, 33) in a task's first thread, and a restored child whose parent has the same actions
  // is not given them again, so a handler left there would outlive the restore.
  const std::string mode = thp_mode();
  if (mode != "madvise" && mode != "always")
    GTEST_SKIP() << "transparent huge pages are '" << mode << "' on this kernel";
  Child root;
  pid_t child = 0;
  ASSERT_TRUE(start_tree("", root, child));
  const std::string hash = ask_unix_line(sock_, "HASH");
  const std::string actions = signal_actions(child);
  ASSERT_NE(actions.find("SigCgt:"), std::string::npos) << actions;

  const fs::path ckpt = dir_.path() / "tree.ckpt";
  json d = run_json({"--json", "dump", "--pid", std::to_string(root.pid()), "-o", ckpt.string()});
  ASSERT_EQ(d.value("ok", false), true);
  root.wait();
  test::wait_until([&] { return !process::alive(child); }, std::chrono::seconds(10));

  json r = run_json({"--json", "restore", ckpt.string(), "--probe", "unix:" + sock_.string()});
  ASSERT_EQ(r.value("ok", false), true);
  Ended restored{r["pid"].get<pid_t>()}, restored_child{child};
  EXPECT_EQ(ask_unix_line(sock_, "HASH"), hash) << "the child's memory differs";
  EXPECT_EQ(signal_actions(child), actions) << "the child's signal actions changed";
  EXPECT_GE(r["huge_page_bytes"].get<std::uint64_t>(), (kDenseMiB - 4) << 20);

  // Again, the child's pages image copied by three streams (scripts/criu-patches/0004), whose
  // helpers are threads of the child as the populate helpers are.
  const fs::path again = dir_.path() / "again.ckpt";
  d = run_json({"--json", "dump", "--pid", std::to_string(restored.pid), "-o", again.string()});
  ASSERT_EQ(d.value("ok", false), true);
  restored.pid = restored_child.pid = 0;  // the dump ended them
  r = run_json({"--json", "restore", again.string(), "--copy-streams", "3", "--probe",
                "unix:" + sock_.string()});
  ASSERT_EQ(r.value("ok", false), true);
  const Ended copied{r["pid"].get<pid_t>()}, copied_child{child};
  EXPECT_EQ(ask_unix_line(sock_, "HASH"), hash) << "the child's memory differs";
  EXPECT_EQ(signal_actions(child), actions) << "the child's signal actions changed";
  bool streamed = false;
  for (const auto& s : r["timeline"]["stages"]) streamed |= s["name"] == "memory_copy";
  EXPECT_TRUE(streamed) << r["timeline"].dump();
}

}  // namespace
