// Floors (gpuckpt/report.h): each stage's bytes through the path ceiling it needs, each
// transient bounded by its slowest overlapping stage (a migration's dump and restore add),
// carried through the report's JSON and table; and the path ceilings measured for real.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "gpuckpt/error.h"
#include "gpuckpt/report.h"
#include "gpuckpt/roofline.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;

namespace {

PathCeilings path() {
  PathCeilings p;
  p.dir = "/ckpt";
  p.cores = 2;
  p.disk_write_gbps = 0.5;
  p.disk_read_gbps = 2.0;
  p.fill_gbps = 0.25;
  p.fill_huge_gbps = 10.0;
  p.fill_huge_warm_gbps = 25.0;  // shown, never a floor: the tests below would see 0.08 s
  p.memcpy_gbps = 10.0;
  p.zstd_compress_gbps = 0.5;
  p.zstd_decompress_gbps = 4.0;
  p.zstd_ratio = 2.0;
  return p;
}

Stage stage(const std::string& name, double seconds, std::uint64_t bytes) {
  Stage s;
  s.name = name;
  s.seconds = seconds;
  s.bytes = bytes;
  return s;
}

constexpr std::uint64_t kGB = 1000000000;

// A floor of `seconds`, bound by `bound`.
::testing::AssertionResult is_floor(const std::optional<Floor>& f, double seconds,
                                    const std::string& bound) {
  if (!f) return ::testing::AssertionFailure() << "no floor";
  if (std::abs(f->seconds - seconds) > 1e-9 || f->bound != bound)
    return ::testing::AssertionFailure() << "floor " << f->seconds << " s (" << f->bound
                                         << "), expected " << seconds << " s (" << bound << ")";
  return ::testing::AssertionSuccess();
}

TEST(Floors, ADumpIsBoundByTheSlowerOfDurableWritesAndZstdOnEveryCore) {
  // 2 GB raw, 1 GB stored: 2.0 s of writes at 0.5 GB/s, 2.0 s of zstd at 2 x 0.5 GB/s.
  auto f = stage_floor(stage("compress_write", 4.0, 2 * kGB), path());
  ASSERT_TRUE(f);
  EXPECT_NEAR(f->seconds, 2.0, 1e-9);
  EXPECT_NEAR(f->percent_of(4.0), 50.0, 1e-9);
  // A checkpoint that compressed 4:1: zstd is the bound now.
  f = stage_floor(stage("compress_write", 4.0, 2 * kGB), path(), {.zstd_ratio = 4.0});
  ASSERT_TRUE(f);
  EXPECT_EQ(f->bound, "zstd");
  EXPECT_NEAR(f->seconds, 2.0, 1e-9);
  PathCeilings fast = path();
  fast.zstd_compress_gbps = 5;
  f = stage_floor(stage("compress_write", 4.0, 2 * kGB), fast);
  EXPECT_EQ(f->bound, "disk write");
}

TEST(Floors, ARestoreFillIsBoundByThePageSizeItFilled) {
  const Stage s = stage("criu_restore_tasks", 3.0, 2 * kGB);
  const auto small = stage_floor(s, path());
  const auto huge = stage_floor(s, path(), {.huge_pages = true});
  ASSERT_TRUE(small && huge);
  EXPECT_NEAR(small->seconds, 8.0, 1e-9);
  EXPECT_EQ(small->bound, "memory fill");
  EXPECT_NEAR(huge->seconds, 0.2, 1e-9);
  EXPECT_EQ(huge->bound, "memory fill (huge pages)");
}

TEST(Floors, StagesWithoutBytesOrAMeasuredCeilingHaveNoFloor) {
  EXPECT_FALSE(stage_floor(stage("preflight", 0.1, 0), path()));
  EXPECT_FALSE(stage_floor(stage("first_answer", 0.1, 0), path()));
  EXPECT_FALSE(stage_floor(stage("transfer", 5, 2 * kGB), path()));  // no network measured
  PathCeilings p = path();
  p.network_gbps = 0.4;
  const auto f = stage_floor(stage("target:receive", 6, 2 * kGB), p);
  EXPECT_TRUE(is_floor(f, 5.0, "network"));
}

Timeline timeline(const std::vector<Stage>& stages) {
  Timeline t;
  for (const auto& s : stages) t.add_measured(s.name, s.seconds, s.bytes);
  return t;
}

TEST(Floors, ARestoreIsBoundByItsSlowestOverlappingStage) {
  // Read 1 GB stored at 2 GB/s = 0.5 s; decompress 2 GB at 8 GB/s = 0.25 s; fill 8 s.
  const Timeline t = timeline({stage("preflight", 0.1, 0), stage("read_decompress", 9, 2 * kGB),
                               stage("criu_restore_tasks", 9, 2 * kGB)});
  const auto f = transient_floor(t, path());
  EXPECT_TRUE(is_floor(f, 8.0, "memory fill"));
}

TEST(Floors, AMigrationAddsItsDumpAndItsRestoreBecauseCriuReadsInventoryLast) {
  const Timeline t =
      timeline({stage("compress_write", 5, 2 * kGB), stage("read_decompress", 2, 2 * kGB),
                stage("criu_restore_tasks", 2, 2 * kGB)});
  const auto f = transient_floor(t, path(), {.huge_pages = true});
  EXPECT_TRUE(is_floor(f, 2.0 + 0.5, "disk write + disk read"));
  EXPECT_FALSE(transient_floor(timeline({stage("spawn", 1, 0)}), path()));
}

TEST(Floors, AMigrationsNetworkOverlapsItsDumpAndRestoreSoOnlyTheLongerCounts) {
  PathCeilings p = path();
  p.network_gbps = 0.4;  // 2 GB: 5 s, longer than disk write + disk read (2.5 s)
  const std::vector<Stage> local = {stage("compress_write", 5, 2 * kGB),
                                    stage("read_decompress", 2, 2 * kGB)};
  auto with = local;
  with.push_back(stage("transfer", 9, 2 * kGB));
  with.push_back(stage("target:receive", 9, 2 * kGB));
  const auto f = transient_floor(timeline(with), p);
  EXPECT_TRUE(is_floor(f, 5.0, "network"));
  p.network_gbps = 4.0;  // 0.5 s: the dump and the restore bound it again
  const auto g = transient_floor(timeline(with), p);
  EXPECT_TRUE(is_floor(g, 2.5, "disk write + disk read"));
}

TEST(Floors, ARestoresOverlappingStagesShareTheCoresSoTheirCpuWorkAdds) {
  // The huge-page fill was measured on 2 threads at 1 GB/s: 2 GB keep both cores busy for 2 s
  // (4 core-seconds). zstd (0.5) and CRIU's copy (0.2) need the same 2 cores: 4.7 / 2 = 2.35 s.
  PathCeilings p = path();
  p.fill_huge_gbps = 1.0;
  p.fill_huge_threads = 2;
  const Timeline t =
      timeline({stage("read_decompress", 3, 2 * kGB), stage("criu_restore_tasks", 3, 2 * kGB)});
  auto f = transient_floor(t, p, {.huge_pages = true});
  EXPECT_TRUE(is_floor(f, 2.35, "CPU (zstd + fill + memcpy on 2 cores)"));
  // The fill and the copy of one stage share them too.
  const auto s = stage_floor(stage("criu_restore_tasks", 3, 2 * kGB), p, {.huge_pages = true});
  EXPECT_TRUE(is_floor(s, 2.1, "CPU (fill + memcpy on 2 cores)"));
  // On 8 cores the work spreads: the fill's own ceiling bounds it again.
  p.cores = 8;
  f = transient_floor(t, p, {.huge_pages = true});
  EXPECT_TRUE(is_floor(f, 2.0, "memory fill (huge pages)"));
}

// A disk fast enough that a dump's CPUs bound it: 5 GB/s, zstd at 1 GB/s a core, 2 cores.
PathCeilings cpu_bound_dump(double memcpy_gbps) {
  PathCeilings p = path();
  p.disk_write_gbps = 5.0;
  p.zstd_compress_gbps = 1.0;
  p.memcpy_gbps = memcpy_gbps;
  return p;
}

TEST(Floors, ADumpCountsCriusNestedStagesAsOneCopyInItsCpuWork) {
  // zstd 2 GB at 1 GB/s per core (2 core-seconds) and one copy out of CRIU's pipe at 4 GB/s
  // (0.5): 2.5 / 2 cores = 1.25 s, above every single ceiling (zstd on both cores 1.0 s, disk
  // 0.2 s, memcpy 0.5 s). Counting criu_dump, criu_memdump and criu_memwrite as three copies
  // would make it 1.75 s.
  const PathCeilings p = cpu_bound_dump(4.0);
  const Timeline t =
      timeline({stage("criu_dump", 3, 2 * kGB), stage("criu_memdump", 3, 2 * kGB),
                stage("criu_memwrite", 2, 2 * kGB), stage("compress_write", 3, 2 * kGB)});
  const auto f = transient_floor(t, p);
  EXPECT_TRUE(is_floor(f, 1.25, "CPU (zstd + memcpy on 2 cores)"));
}

// --compress adaptive: a dump may store a share of its chunks uncompressed, so its floor is that
// of the best share, where the disk's extra bytes and the CPUs' saved zstd balance.
TEST(Floors, AnAdaptiveDumpsFloorStoresTheShareThatBalancesTheDiskAndTheCpus) {
  // 2 GB, 2:1. Every chunk compressed: CPU (2 core-seconds of zstd + 0.25 of copy) / 2 cores =
  // 1.125 s. A share r raw: the CPUs need (2 (1 - r) + 0.25) / 2 s, the disk (1 + r) GB / 5 GB/s;
  // they meet near r = 0.771, and on the grid of whole percents 77% is the lowest (0.355 s).
  const PathCeilings p = cpu_bound_dump(8.0);
  const Timeline t =
      timeline({stage("criu_dump", 3, 2 * kGB), stage("compress_write", 3, 2 * kGB)});
  EXPECT_TRUE(is_floor(transient_floor(t, p), 1.125, "CPU (zstd + memcpy on 2 cores)"));
  EXPECT_TRUE(is_floor(transient_floor(t, p, {.adaptive_compression = true}), 0.355,
                       "CPU (zstd + memcpy on 2 cores) (77% stored uncompressed)"));
  // The stage alone, zstd on both cores against the disk: 1 - r against 0.2 + 0.2 r.
  EXPECT_TRUE(
      is_floor(stage_floor(stage("compress_write", 3, 2 * kGB), p, {.adaptive_compression = true}),
               0.334, "disk write (67% stored uncompressed)"));
}

TEST(Floors, AnAdaptiveDumpBoundByItsDiskKeepsTheFloorOfCompressingEverything) {
  // path(): the disk and zstd on both cores both take 2.0 s for 2 GB: storing any share raw
  // only adds to the disk's bytes.
  const Stage cw = stage("compress_write", 4.0, 2 * kGB);
  EXPECT_TRUE(is_floor(stage_floor(cw, path(), {.adaptive_compression = true}), 2.0, "disk write"));
  // Its stored bytes count at the better of the checkpoint's ratio (which fell by what the dump
  // did not compress) and the path's sample ratio, 2.0: 1 GB at 0.5 GB/s.
  PathCeilings fast = path();
  fast.zstd_compress_gbps = 5;
  EXPECT_TRUE(is_floor(stage_floor(cw, fast, {.zstd_ratio = 1.25, .adaptive_compression = true}),
                       2.0, "disk write"));
  EXPECT_TRUE(is_floor(stage_floor(cw, fast, {.zstd_ratio = 1.25}), 3.2, "disk write"));
}

TEST(Floors, TheReportCarriesThePathAndEachFloorThroughItsJsonAndTable) {
  TransientReport r;
  r.path = path();
  r.restore =
      timeline({stage("read_decompress", 1, 2 * kGB), stage("criu_restore_tasks", 1, 2 * kGB)});
  r.restore_runs = {1.0};
  r.restore_context.huge_pages = true;
  const auto j = nlohmann::json(render_json(r));
  ASSERT_TRUE(j["path"].is_object());
  EXPECT_DOUBLE_EQ(j["path"]["disk_write_gbps"].get<double>(), 0.5);
  const auto& floor = j["restore"]["floors"]["floor"];
  EXPECT_NEAR(floor["seconds"].get<double>(), 0.5, 1e-9);
  EXPECT_EQ(floor["bound"], "disk read");
  EXPECT_GT(floor["percent"].get<double>(), 0);
  EXPECT_EQ(j["restore"]["floors"]["stages"].size(), 2u);

  const TransientReport back = parse_report_json(render_json(r).dump(), "test");
  ASSERT_TRUE(back.path);
  EXPECT_DOUBLE_EQ(back.path->fill_huge_gbps, 10.0);
  EXPECT_DOUBLE_EQ(back.path->fill_huge_warm_gbps, 25.0);
  // The fill's threads travel too (the CPU budget needs them); nonsense is refused.
  r.path->fill_huge_threads = 3;
  auto threads = nlohmann::json(render_json(r));
  EXPECT_EQ(parse_report_json(threads.dump(), "test").path->fill_huge_threads, 3u);
  threads["path"]["fill_huge_threads"] = 0;
  EXPECT_THROW(parse_report_json(threads.dump(), "test"), Error);
  EXPECT_TRUE(back.restore_context.huge_pages);
  const std::string table = render_table(back);
  EXPECT_NE(table.find("floor 500.0 ms (disk read)"), std::string::npos) << table;
  EXPECT_NE(table.find("checkpoint path"), std::string::npos) << table;
}

TEST(PathCeilings, AreMeasuredOnTheGivenFilesystemAndLeaveNothingThere) {
  const auto dir = test::scratch_dir("gpuckpt-floors");
  PathMeasureOptions o;
  o.dir = dir.path();
  o.bytes = 16u << 20;
  const PathCeilings p = measure_path_ceilings(o);
  EXPECT_GT(p.disk_write_gbps, 0);
  EXPECT_GT(p.disk_read_gbps, 0);
  EXPECT_GT(p.fill_gbps, 0);
  // The first of three tries, and the best of the same three.
  EXPECT_GE(p.fill_huge_warm_gbps, p.fill_huge_gbps);
  EXPECT_GT(p.memcpy_gbps, 0);
  EXPECT_GT(p.zstd_compress_gbps, 0);
  EXPECT_GT(p.zstd_decompress_gbps, 0);
  EXPECT_GT(p.zstd_ratio, 1.1);  // the generated sample is half fp16-like
  EXPECT_GE(p.cores, 1u);
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(PathCeilings, AMissingDirectoryOrSampleIsRefused) {
  PathMeasureOptions o;
  o.dir = "/nonexistent/gpuckpt";
  try {
    measure_path_ceilings(o);
    FAIL() << "a missing directory was measured";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidInput);
  }
  const auto dir = test::scratch_dir("gpuckpt-floors");
  o.dir = dir.path();
  o.bytes = 8u << 20;
  o.sample = dir.path() / "missing.bin";
  EXPECT_THROW(measure_path_ceilings(o), Error);
}

TEST(PathCeilings, RooflineTransientPrintsThemAsJson) {
  const auto dir = test::scratch_dir("gpuckpt-floors");
  const auto r = test::run_cli({"--json", "roofline", "--target", "cpu", "--quick", "--transient",
                                "--dir", dir.path().string(), "--bytes", "8M", "--settle", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j["path"].is_object()) << r.out;
  EXPECT_GE(j["path"]["fill_huge_warm_gbps"].get<double>(),
            j["path"]["fill_huge_gbps"].get<double>());
  EXPECT_GT(j["path"]["disk_write_gbps"].get<double>(), 0);
  EXPECT_EQ(j["path"]["sample"], "generated: half incompressible, half fp16-like");
}

}  // namespace
