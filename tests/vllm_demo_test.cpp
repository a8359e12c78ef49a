// gpuckpt-vllm-demo as real processes: its tree (front, engine, workers), the HTTP API, answers
// that are a deterministic function of each session's history, and how the tree ends.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "gpuckpt/error.h"
#include "process/proc_info.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

namespace {

using Clock = std::chrono::steady_clock;

std::string comm(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string s;
  std::getline(in, s);
  return s;
}

pid_t parent(pid_t pid) {
  const auto info = process::read_proc(pid);
  return info ? info->ppid : 0;
}

// True if none of `pids` is alive (gone or a zombie) before the deadline.
bool all_end(const std::vector<pid_t>& pids, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    const bool any = std::any_of(pids.begin(), pids.end(), [](pid_t p) {
      const auto info = process::read_proc(p);
      return info && info->state != 'Z' && info->state != 'X';
    });
    if (!any) return true;
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(5ms);  // polling a condition, bounded by the deadline
  }
}

// The ring's /dev/shm name, from the READY line in the log.
std::string shm_name(const fs::path& log) {
  std::smatch m;
  const std::string text = read_file(log);
  if (!std::regex_search(text, m, std::regex("READY http://[^ ]+ workers=\\d+ shm=(\\S+)")))
    return {};
  return m[1];
}

// The engine names its ring after its pid; true if no pid of `tree` left one in /dev/shm.
bool no_ring_left(const std::vector<pid_t>& tree) {
  return std::none_of(tree.begin(), tree.end(), [](pid_t p) {
    return fs::exists("/dev/shm/gpuckpt-vllm-" + std::to_string(p));
  });
}

struct VllmDemo : ::testing::Test {
  TempDir dir = test::scratch_dir("gpuckpt-vllm");
};

}  // namespace

TEST_F(VllmDemo, TreeIsAFrontWithOneEngineAndNWorkers) {
  auto d = test::start_vllm_demo(dir.path(), {"--workers", "3", "--weights-mib", "2"});
  const auto tree = test::descendants(d.front.pid());
  ASSERT_EQ(tree.size(), 1u + 3u) << read_file(d.log);
  std::vector<std::string> names;
  for (pid_t p : tree) {
    EXPECT_EQ(parent(p), d.front.pid()) << "everything is forked by the front";
    names.push_back(comm(p));
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("vllm-engine", "vllm-worker-0",
                                                     "vllm-worker-1", "vllm-worker-2"));

  const auto health = test::http_request(d.port, "GET", "/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.body, "ok\n");
  const auto models = nlohmann::json::parse(test::http_request(d.port, "GET", "/v1/models").body);
  EXPECT_EQ(models["data"][0]["id"], "gpuckpt-vllm-demo");
  // Like vLLM's shm broadcast: the name is gone once every worker mapped the ring.
  const std::string shm = shm_name(d.log);
  ASSERT_FALSE(shm.empty()) << read_file(d.log);
  EXPECT_FALSE(fs::exists("/dev/shm" + shm));
}

TEST_F(VllmDemo, CompletionsAreADeterministicFunctionOfTheSessionHistory) {
  auto a = test::start_vllm_demo(dir.path(), {"--weights-mib", "2"});
  auto dir_b = test::scratch_dir("gpuckpt-vllm-b");
  auto b = test::start_vllm_demo(dir_b.path(), {"--weights-mib", "2"});
  // The same conversation on two trees, with a second session interleaved on one of them.
  const std::vector<std::string> turns = {"Hello, who are you?", "Tell me about KV caches.",
                                          "And checkpoints?"};
  std::vector<std::string> ta, tb;
  for (const auto& t : turns) {
    ta.push_back(test::vllm_complete(a.port, "chat", t, 12));
    test::vllm_complete(a.port, "other", "noise " + t, 3);
    tb.push_back(test::vllm_complete(b.port, "chat", t, 12));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta[0], ta[1]);
  std::istringstream words(ta[0]);
  EXPECT_EQ(std::distance(std::istream_iterator<std::string>(words), {}), 12) << ta[0];

  // The text depends on the history, not on the session's name: a fresh session that gets the
  // same turns answers the same, one with another history answers differently.
  EXPECT_EQ(test::vllm_complete(a.port, "fresh", turns[0], 12), ta[0]);
  EXPECT_NE(test::vllm_complete(a.port, "other2", turns[1], 12), ta[1]);

  const auto reply = nlohmann::json::parse(test::http_post_json(
      a.port, "/v1/completions", R"({"prompt": "abc", "max_tokens": 2, "session": "u"})"));
  EXPECT_THAT(reply["id"].get<std::string>(), HasSubstr("cmpl-"));
  EXPECT_EQ(reply["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(reply["usage"]["completion_tokens"], 2);
  EXPECT_EQ(reply["usage"]["total_tokens"], 5);
}

TEST_F(VllmDemo, WeightsSeedAndWorkerCountChangeTheAnswers) {
  auto a = test::start_vllm_demo(dir.path(), {"--weights-mib", "1"});
  auto d2 = test::scratch_dir("gpuckpt-vllm-b");
  auto b = test::start_vllm_demo(d2.path(), {"--weights-mib", "1", "--seed", "2"});
  auto d3 = test::scratch_dir("gpuckpt-vllm-c");
  auto c = test::start_vllm_demo(d3.path(), {"--weights-mib", "1", "--workers", "1"});
  const std::string ref = test::vllm_complete(a.port, "s", "same prompt", 16);
  EXPECT_NE(test::vllm_complete(b.port, "s", "same prompt", 16), ref);
  EXPECT_NE(test::vllm_complete(c.port, "s", "same prompt", 16), ref);
}

TEST_F(VllmDemo, LongPromptsArePrefilledInChunks) {
  auto d = test::start_vllm_demo(dir.path(), {"--weights-mib", "1"});
  std::string prompt;
  for (int i = 0; prompt.size() < 100000; ++i) prompt += "token" + std::to_string(i) + " ";
  const std::string t1 = test::vllm_complete(d.port, "long1", prompt, 4);
  EXPECT_EQ(test::vllm_complete(d.port, "long2", prompt, 4), t1);
  prompt.back() = '!';  // the last chunk matters too
  EXPECT_NE(test::vllm_complete(d.port, "long3", prompt, 4), t1);
}

TEST_F(VllmDemo, BadRequestsAreClientErrors) {
  auto d = test::start_vllm_demo(dir.path(), {"--workers", "1", "--weights-mib", "1"});
  EXPECT_EQ(test::http_request(d.port, "POST", "/v1/completions", "{not json").status, 400);
  EXPECT_EQ(test::http_request(d.port, "POST", "/v1/completions", R"({"max_tokens": 3})").status,
            400);
  EXPECT_EQ(
      test::http_request(d.port, "POST", "/v1/completions", R"({"prompt":"x","max_tokens":0})")
          .status,
      400);
  EXPECT_EQ(test::http_request(d.port, "GET", "/v1/completions").status, 405);
  const auto nf = test::http_request(d.port, "GET", "/nope");
  EXPECT_EQ(nf.status, 404);
  EXPECT_THAT(nf.body, HasSubstr("error"));
  // Still serving after all that.
  EXPECT_FALSE(test::vllm_complete(d.port, "s", "fine").empty());
}

TEST_F(VllmDemo, HealthIs503UntilTheWorkersAreUp) {
  const fs::path port_file = dir.path() / "port";
  SpawnOptions so;
  so.stdout_file = so.stderr_file = dir.path() / "log";
  // The workers "load" for far longer than this test takes.
  Child front = spawn({(test::bin_dir() / "gpuckpt-vllm-demo").string(), "--port", "0",
                       "--port-file", port_file.string(), "--init-seconds", "600"},
                      so);
  while (!fs::exists(port_file)) ASSERT_FALSE(front.wait_for(10ms)) << read_file(so.stderr_file);
  const int port = std::stoi(read_file(port_file));
  EXPECT_EQ(test::http_request(port, "GET", "/health").status, 503);
  EXPECT_EQ(test::http_request(port, "POST", "/v1/completions", R"({"prompt":"x"})").status, 503);
  const auto tree = test::descendants(front.pid());
  EXPECT_EQ(tree.size(), 3u);
  // SIGTERM while loading still ends the tree, promptly.
  front.kill(SIGTERM);
  const auto st = front.wait_for(20s);
  ASSERT_TRUE(st) << "the front did not exit";
  EXPECT_TRUE(st->ok()) << st->describe() << "\n" << read_file(so.stderr_file);
  EXPECT_TRUE(all_end(tree, 5s));
  EXPECT_TRUE(no_ring_left(tree)) << "the engine ended before the workers mapped its ring";
}

TEST_F(VllmDemo, SigtermToTheFrontEndsTheWholeTree) {
  auto d =
      test::start_vllm_demo(dir.path(), {"--workers", "2", "--weights-mib", "1", "--keep-shm"});
  test::vllm_complete(d.port, "s", "before the end");
  const auto tree = test::descendants(d.front.pid());
  ASSERT_EQ(tree.size(), 3u);
  const std::string shm = shm_name(d.log);
  EXPECT_TRUE(fs::exists("/dev/shm" + shm)) << "--keep-shm keeps the name while it runs";
  d.front.kill(SIGTERM);
  const auto st = d.front.wait_for(20s);
  ASSERT_TRUE(st) << "the front did not exit";
  EXPECT_TRUE(st->ok()) << st->describe() << "\n" << read_file(d.log);
  EXPECT_TRUE(all_end(tree, 5s));  // the front reaps its children before it exits
  EXPECT_FALSE(fs::exists("/dev/shm" + shm));
}

TEST_F(VllmDemo, KillingTheFrontEndsTheEngineAndTheWorkers) {
  auto d =
      test::start_vllm_demo(dir.path(), {"--workers", "2", "--weights-mib", "1", "--keep-shm"});
  const auto tree = test::descendants(d.front.pid());
  ASSERT_EQ(tree.size(), 3u);
  ASSERT_FALSE(no_ring_left(tree));
  d.front.kill(SIGKILL);
  d.front.wait();
  EXPECT_TRUE(all_end(tree, 20s)) << "orphans left behind";
  EXPECT_TRUE(no_ring_left(tree)) << "the engine's SIGTERM (PR_SET_PDEATHSIG) unlinks the ring";
}

TEST_F(VllmDemo, ADeadWorkerStopsTheTree) {
  auto d = test::start_vllm_demo(dir.path(), {"--workers", "2", "--weights-mib", "1"});
  const auto tree = test::descendants(d.front.pid());
  pid_t worker = 0;
  for (pid_t p : tree)
    if (comm(p) == "vllm-worker-1") worker = p;
  ASSERT_GT(worker, 0);
  ASSERT_EQ(::kill(worker, SIGKILL), 0);
  const auto st = d.front.wait_for(20s);
  ASSERT_TRUE(st) << "the front kept running without a worker";
  EXPECT_EQ(st->code, 1) << st->describe();
  EXPECT_THAT(read_file(d.log), HasSubstr("worker 1"));
  EXPECT_TRUE(all_end(tree, 5s));
}
