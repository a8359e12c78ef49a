// The cold-start measurement against real processes (the demo server, shell wrappers), and the
// roofline -> bench -> report pipeline through the real CLI.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "gpuckpt/device.h"
#include "gpuckpt/error.h"
#include "gpuckpt/report.h"
#include "gpuckpt/support.h"
#include "report/format.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using namespace std::chrono_literals;

namespace {

fs::path demo_server() {
  return test::bin_dir() / "gpuckpt-demo-server";
}

#define REQUIRE_DEMO_SERVER()     \
  if (!fs::exists(demo_server())) \
  GTEST_SKIP() << "gpuckpt-demo-server not built (tools/demo_server)"

// True once `pid` is gone (or a zombie no one has reaped yet).
bool dead_within(pid_t pid, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(f, line)) return true;
    const auto rp = line.rfind(')');
    if (rp != std::string::npos && rp + 2 < line.size() && line[rp + 2] == 'Z') return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

std::vector<std::string> stage_names(const Timeline& t) {
  std::vector<std::string> v;
  for (const auto& s : t.stages()) v.push_back(s.name);
  return v;
}

}  // namespace

TEST(ColdStart, DemoServerThroughUnixProbeWithRequest) {
  REQUIRE_DEMO_SERVER();
  auto dir = test::scratch_dir();
  const fs::path sock = dir.path() / "s.sock";
  ColdStartOptions o;
  o.argv = {demo_server().string(), "--socket", sock.string(), "--init-seconds", "0.2"};
  o.probe = parse_probe("unix:" + sock.string());
  o.probe.request = "PING";
  o.probe.timeout = 60s;
  o.log_file = dir.path() / "server.log";
  o.stop_timeout = 2000ms;
  const Timeline t = measure_cold_start(o);
  EXPECT_EQ(stage_names(t), (std::vector<std::string>{"spawn", "ready", "first_answer"}));
  // The probe really waited for the service's init (a lower bound, not a performance claim).
  EXPECT_GE(t.find("ready")->seconds + t.find("spawn")->seconds, 0.2);
  EXPECT_GE(t.find("first_answer")->start_offset,
            t.find("ready")->start_offset + t.find("ready")->seconds);
  // Its stdout went to the log, not to ours.
  EXPECT_NE(read_file(o.log_file).find("READY"), std::string::npos);
}

TEST(ColdStart, StdoutProbeAndTheWholeProcessGroupIsStopped) {
  auto dir = test::scratch_dir();
  const fs::path pidfile = dir.path() / "grandchild.pid";
  ColdStartOptions o;
  // A wrapper whose real service is a grandchild: stopping only the wrapper would leak it.
  o.argv = {"sh", "-c",
            "sleep 100 & echo $! > " + pidfile.string() + "; sleep 0.1; echo 'server READY'; wait"};
  o.probe = parse_probe("stdout:READY");
  o.probe.timeout = 60s;
  o.stop_timeout = 5000ms;
  const Timeline t = measure_cold_start(o);
  EXPECT_EQ(stage_names(t), (std::vector<std::string>{"spawn", "ready"}));
  const pid_t grandchild = std::stoi(read_file(pidfile));
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(dead_within(grandchild, 5s)) << "pid " << grandchild << " outlived the run";
}

TEST(ColdStart, ServiceThatExitsEarlyIsAProcessError) {
  auto dir = test::scratch_dir();
  ColdStartOptions o;
  o.argv = {"sh", "-c", "exit 3"};
  o.probe = parse_probe("unix:" + (dir.path() / "never.sock").string());
  o.probe.timeout = 60s;
  try {
    measure_cold_start(o);
    FAIL() << "should fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kProcess);
    EXPECT_NE(std::string(e.what()).find("exit code 3"), std::string::npos) << e.what();
  }
  o.argv = {"sh", "-c", "echo starting; exit 4"};
  o.probe = parse_probe("stdout:READY");
  try {
    measure_cold_start(o);
    FAIL() << "should fail";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kProcess);
    EXPECT_NE(std::string(e.what()).find("exit code 4"), std::string::npos) << e.what();
  }
}

TEST(ColdStart, BadSetupsAreRefused) {
  ColdStartOptions o;
  o.argv = {"/nonexistent/server"};
  o.probe = parse_probe("tcp:127.0.0.1:1");
  try {
    measure_cold_start(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidInput);
  }
  o.argv = {"true"};
  o.probe = ReadinessProbe{};
  try {
    measure_cold_start(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUsage);
  }
  o.probe = parse_probe("stdout:READY");
  o.probe.request = "PING";
  try {
    measure_cold_start(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kUsage);
  }
}

TEST(ColdStart, SilentServiceTimesOutAndIsStopped) {
  auto dir = test::scratch_dir();
  ColdStartOptions o;
  o.argv = {"sh", "-c", "exec sleep 100"};
  o.probe = parse_probe("unix:" + (dir.path() / "never.sock").string());
  o.probe.timeout = 300ms;
  pid_t service = 0;
  o.on_running = [&](pid_t pgid) {
    if (pgid > 0) service = pgid;
  };
  try {
    measure_cold_start(o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kTimeout);
  }
  ASSERT_GT(service, 0);
  EXPECT_TRUE(dead_within(service, 5s));
}

TEST(ReportCli, RooflineBenchReportPipeline) {
  REQUIRE_DEMO_SERVER();
  auto dir = test::scratch_dir();
  const fs::path sock = dir.path() / "s.sock";
  auto cs = test::run_cli({"--json", "bench", "coldstart", "--probe", "unix:" + sock.string(),
                           "--request", "PING", "--runs", "2", "--", demo_server().string(),
                           "--socket", sock.string(), "--init-seconds", "0.1"});
  ASSERT_EQ(cs.exit_code, 0) << cs.err;
  const auto csj = nlohmann::json::parse(cs.out);
  EXPECT_EQ(csj.at("ok"), true);
  EXPECT_EQ(csj.at("kind"), "coldstart");
  EXPECT_EQ(csj.at("runs").size(), 2u);
  EXPECT_EQ(csj.at("summary").at("runs"), 2);
  EXPECT_EQ(csj.at("probe"), "unix:" + sock.string());
  ASSERT_EQ(csj.at("timeline").at("stages").size(), 3u);
  EXPECT_EQ(csj.at("timeline").at("stages")[2].at("name"), "first_answer");
  write_file_atomic(dir.path() / "cs.json", cs.out);

  auto rf =
      test::run_cli({"--json", "roofline", "--target", "cpu", "--quick", "--kernel", "triad"});
  ASSERT_EQ(rf.exit_code, 0) << rf.err;
  const auto rfj = nlohmann::json::parse(rf.out);
  EXPECT_EQ(rfj.at("kind"), "roofline");
  EXPECT_EQ(rfj.at("ceilings").at("target"), "cpu");
  EXPECT_EQ(rfj.at("kernel").at("name"), "triad");
  EXPECT_EQ(rfj.at("placement").at("label"), "triad");
  EXPECT_TRUE(rfj.at("placement").at("memory_bound").get<bool>());
  write_file_atomic(dir.path() / "rf.json", rf.out);

  const fs::path svg = dir.path() / "out.svg", html = dir.path() / "out.html";
  auto rep = test::run_cli({"report", "--coldstart", (dir.path() / "cs.json").string(),
                            "--roofline", (dir.path() / "rf.json").string(), "--svg", svg.string(),
                            "--html", html.string()});
  ASSERT_EQ(rep.exit_code, 0) << rep.err;
  const double total = csj.at("timeline").at("total_seconds").get<double>();
  EXPECT_NE(rep.out.find("cold start (decision -> first token):"), std::string::npos) << rep.out;
  EXPECT_NE(rep.out.find(format_seconds(total)), std::string::npos) << rep.out;
  EXPECT_NE(rep.out.find(report::fmt_gbps(rfj.at("ceilings").at("bandwidth_gbps").get<double>())),
            std::string::npos)
      << rep.out;
  EXPECT_NE(rep.out.find("restore (interruption -> serving): not measured"), std::string::npos);
  const std::string s = read_file(svg);
  EXPECT_EQ(s.rfind("<svg", 0), 0u);
  EXPECT_NE(s.find(format_seconds(total)), std::string::npos);
  EXPECT_NE(s.find("triad"), std::string::npos);
  EXPECT_NE(read_file(html).find("<svg"), std::string::npos);

  // --json round-trips into --input.
  auto rj = test::run_cli({"--json", "report", "--coldstart", (dir.path() / "cs.json").string()});
  ASSERT_EQ(rj.exit_code, 0) << rj.err;
  EXPECT_EQ(nlohmann::json::parse(rj.out).at("kind"), "transient_report");
  write_file_atomic(dir.path() / "rep.json", rj.out);
  auto again = test::run_cli({"report", "--input", (dir.path() / "rep.json").string()});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.out.find(format_seconds(total)), std::string::npos);
}

TEST(ReportCli, BadInputsAndUsage) {
  auto dir = test::scratch_dir();
  EXPECT_EQ(test::run_cli({"report"}).exit_code, 2);
  EXPECT_EQ(
      test::run_cli({"report", "--restore", (dir.path() / "missing.json").string()}).exit_code, 2);
  write_file_atomic(dir.path() / "garbage.json", "{\"kind\": \"restore\"}");
  auto wrong = test::run_cli({"report", "--coldstart", (dir.path() / "garbage.json").string()});
  EXPECT_EQ(wrong.exit_code, 3);
  EXPECT_NE(wrong.err.find("garbage.json"), std::string::npos) << wrong.err;
  auto both =
      test::run_cli({"report", "--roofline", (dir.path() / "garbage.json").string(), "--measure"});
  EXPECT_EQ(both.exit_code, 2);
  // No chart is written when the inputs are bad.
  auto nosvg = test::run_cli({"report", "--coldstart", (dir.path() / "garbage.json").string(),
                              "--svg", (dir.path() / "x.svg").string()});
  EXPECT_EQ(nosvg.exit_code, 3);
  EXPECT_FALSE(fs::exists(dir.path() / "x.svg"));

  EXPECT_EQ(test::run_cli({"roofline", "--intensity", "0"}).exit_code, 2);
  EXPECT_EQ(test::run_cli({"roofline", "--target", "cpu", "--achieved", "5"}).exit_code, 2);
  EXPECT_EQ(test::run_cli({"roofline", "--target", "tpu"}).exit_code, 2);
  EXPECT_EQ(test::run_cli({"bench", "coldstart", "--probe", "stdout:READY", "--request", "PING",
                           "--", "true"})
                .exit_code,
            2);
  EXPECT_EQ(test::run_cli({"bench", "coldstart", "--probe", "bogus:x", "--", "true"}).exit_code, 2);
}

TEST(ReportCli, GpuRooflineWithoutAGpuIsNoDevice) {
  if (!list_devices().gpus.empty()) GTEST_SKIP() << "a GPU is present";
  auto r = test::run_cli({"roofline", "--target", "gpu", "--quick"});
  EXPECT_EQ(r.exit_code, 7) << r.err;
  auto j = test::run_cli({"--json", "roofline", "--target", "gpu", "--quick"});
  EXPECT_EQ(j.exit_code, 7);
  EXPECT_EQ(nlohmann::json::parse(j.out).at("ok"), false);
}

TEST(ReportCli, InterruptedColdStartTakesItsServiceDown) {
  auto dir = test::scratch_dir();
  const fs::path pidfile = dir.path() / "pid";
  SpawnOptions so;
  so.stderr_file = dir.path() / "stderr";
  Child cli = spawn({test::gpuckpt_binary().string(), "bench", "coldstart", "--probe",
                     "unix:" + (dir.path() / "never.sock").string(), "--", "sh", "-c",
                     "echo $$ > " + pidfile.string() + "; exec sleep 100"},
                    so);
  ASSERT_TRUE(test::wait_until(
      [&] {
        std::error_code ec;
        return fs::file_size(pidfile, ec) > 0 && !ec;
      },
      60s))
      << "the service never wrote its pid";
  const pid_t service = std::stoi(read_file(pidfile));
  // gpuckpt records the service's group as soon as its exec has succeeded.
  ASSERT_TRUE(test::wait_until([&] {
    std::ifstream in("/proc/" + std::to_string(service) + "/comm");
    std::string c;
    return std::getline(in, c) && c == "sleep";
  }));
  cli.kill(SIGINT);
  const ExitStatus st = cli.wait();
  EXPECT_FALSE(st.exited);
  EXPECT_EQ(st.code, SIGINT);
  EXPECT_TRUE(dead_within(service, 5s)) << "the service outlived an interrupted benchmark";
}
