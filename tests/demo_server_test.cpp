// The demo server is the workload of the CRIU end-to-end tests: its answers must be
// deterministic and depend on all earlier requests, or those tests prove nothing.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>
#include <fstream>
#include <thread>

#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;

namespace {

class DemoServer {
 public:
  DemoServer(const fs::path& dir, const std::string& name, const fs::path& weights) {
    socket_ = dir / (name + ".sock");
    SpawnOptions o;
    o.stdout_file = dir / (name + ".out");
    child_ = spawn({(test::bin_dir() / "gpuckpt-demo-server").string(), "--socket",
                    socket_.string(), "--weights", weights.string(), "--kv-per-request", "64K"},
                   o);
    // READY, not the socket file: a connect between bind and listen is refused.
    const bool ready = test::wait_until([&] {
      std::ifstream in(o.stdout_file);
      std::string line;
      return std::getline(in, line) && line.rfind("READY", 0) == 0;
    });
    EXPECT_TRUE(ready) << "demo server " << name << " did not get ready";
  }
  std::string ask(const std::string& line) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, socket_.c_str());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return "connect failed";
    }
    std::string req = line + "\n";
    EXPECT_EQ(::write(fd, req.data(), req.size()), static_cast<ssize_t>(req.size()));
    std::string out;
    char c;
    while (::read(fd, &c, 1) == 1 && c != '\n') out += c;
    ::close(fd);
    return out;
  }
  Child& child() { return child_; }

 private:
  fs::path socket_;
  Child child_;
};

}  // namespace

TEST(DemoServer, AnswersDependOnEveryEarlierRequestAndAreDeterministic) {
  auto dir = test::scratch_dir();
  const fs::path weights = dir.path() / "w.bin";
  ASSERT_EQ(run_capture({(test::bin_dir() / "gpuckpt-demo-server").string(), "--generate-weights",
                         weights.string(), "--size", "4M"},
                        std::chrono::seconds(30))
                .status.code,
            0);
  ASSERT_EQ(fs::file_size(weights), 4u << 20);

  DemoServer a(dir.path(), "a", weights), b(dir.path(), "b", weights);
  EXPECT_EQ(a.ask("PING"), "PONG");
  const std::string a1 = a.ask("GEN one"), a2 = a.ask("GEN two");
  const std::string b1 = b.ask("GEN one"), b2 = b.ask("GEN two");
  EXPECT_EQ(a1, b1);
  EXPECT_EQ(a2, b2);
  EXPECT_NE(a1, a2);
  EXPECT_EQ(a.ask("STATE"), a2);
  EXPECT_EQ(a2.substr(0, 5), "OK 2 ");
  EXPECT_NE(a2.find(" 131072"), std::string::npos);  // two 64 KiB KV blocks

  // Same requests, other order: other state.
  DemoServer c(dir.path(), "c", weights);
  c.ask("GEN two");
  EXPECT_NE(c.ask("GEN one"), a2);

  EXPECT_EQ(a.ask("WEIGHTS"), b.ask("WEIGHTS"));
  EXPECT_EQ(a.ask("QUIT"), "BYE");
  auto st = a.child().wait_for(std::chrono::seconds(10));
  ASSERT_TRUE(st.has_value());
  EXPECT_TRUE(st->ok()) << st->describe();
}

TEST(DemoServer, MissingWeightsFileIsAClearError) {
  auto dir = test::scratch_dir();
  SpawnOptions o;
  o.stderr_file = dir.path() / "err";
  auto r = run_capture({(test::bin_dir() / "gpuckpt-demo-server").string(), "--socket",
                        (dir.path() / "s").string(), "--weights", "/nonexistent/w.bin"},
                       std::chrono::seconds(10), o);
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(read_file(dir.path() / "err").find("/nonexistent/w.bin"), std::string::npos);
}
