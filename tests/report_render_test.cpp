// The transient report: table, JSON round trips, and the chart rendered for real (rsvg-convert
// to PNG, netpbm's pngtopnm to PPM) and checked pixel by pixel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gpuckpt/error.h"
#include "gpuckpt/report.h"
#include "gpuckpt/support.h"
#include "report/format.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace gpuckpt;

namespace {

struct S {
  const char* name;
  double start, seconds;
  std::uint64_t bytes = 0;
};

Timeline make_timeline(const std::vector<S>& stages) {
  Timeline t;
  using D = Timeline::Clock::duration;
  auto at = [&](double s) {
    return t.origin() + std::chrono::round<D>(std::chrono::duration<double>(s));
  };
  for (const auto& s : stages) t.add(s.name, at(s.start), at(s.start + s.seconds), s.bytes);
  return t;
}

// A GPU-like report: tensor ceiling, a placed workload, all three transients, nested and
// overlapping restore stages.
TransientReport sample() {
  TransientReport r;
  r.ceilings.target = "gpu";
  r.ceilings.device_name = "NVIDIA H200";
  r.ceilings.bandwidth_gbps = 4315.2;
  r.ceilings.fp32_gflops = 59001.2;
  r.ceilings.tensor_gflops = 480000.0;
  r.ceilings.method = "GPU kernels (gpuckpt-roofline-gpu)";
  r.ceilings.details = {{"copy_gbps", 4315.2}};
  Ceilings c = r.ceilings;
  r.workload = place_on_roofline(c, 2.5, 7000.0);
  r.cold_start =
      make_timeline({{"spawn", 0, 0.002}, {"ready", 0.002, 41.5}, {"first_answer", 41.502, 0.35}});
  r.cold_start_runs = {41.852, 40.9, 43.0};
  r.restore = make_timeline({{"read_decompress", 0, 1.25, 20ULL << 30},
                             {"criu_restore", 1.25, 2.0},
                             {"criu_forking", 1.25, 0.1},
                             {"criu_restore_tasks", 1.25, 1.5, 8ULL << 30},
                             {"cuda_restore", 3.25, 0.8},
                             {"first_answer", 4.05, 0.05}});
  r.restore_runs = {4.1};
  r.migration = make_timeline({{"freeze", 0, 0.01},
                               {"cuda_checkpoint", 0.01, 1.9},
                               {"criu_dump", 1.91, 2.5},
                               {"compress_write", 4.41, 3.0},
                               {"read_decompress", 7.41, 1.25},
                               {"criu_restore", 8.66, 2.0},
                               {"first_answer", 10.66, 0.05}});
  r.migration_runs = {10.71};
  return r;
}

void expect_same_timeline(const Timeline& a, const Timeline& b) {
  ASSERT_EQ(a.stages().size(), b.stages().size());
  for (size_t i = 0; i < a.stages().size(); ++i) {
    EXPECT_EQ(a.stages()[i].name, b.stages()[i].name);
    EXPECT_NEAR(a.stages()[i].seconds, b.stages()[i].seconds, 1e-8);
    EXPECT_NEAR(a.stages()[i].start_offset, b.stages()[i].start_offset, 1e-8);
    EXPECT_EQ(a.stages()[i].bytes, b.stages()[i].bytes);
  }
}

// A decoded binary PPM (P6, maxval 255).
struct Image {
  int width = 0, height = 0;
  std::vector<unsigned char> rgb;
  const unsigned char* at(int x, int y) const {
    return &rgb[(static_cast<size_t>(y) * width + x) * 3];
  }
};

Image render_png_and_decode(const std::string& svg, const fs::path& dir) {
  write_file_atomic(dir / "chart.svg", svg);
  auto r = run_capture(
      {"rsvg-convert", "-o", (dir / "chart.png").string(), (dir / "chart.svg").string()},
      std::chrono::seconds(60));
  EXPECT_TRUE(r.status.ok()) << "rsvg-convert: " << r.status.describe();
  EXPECT_GT(fs::file_size(dir / "chart.png"), 1000u);
  SpawnOptions o;
  o.stdout_file = dir / "chart.ppm";
  Child c = spawn({"pngtopnm", (dir / "chart.png").string()}, o);
  EXPECT_TRUE(c.wait().ok()) << "pngtopnm failed (netpbm is in scripts/setup.sh)";
  std::ifstream f(dir / "chart.ppm", std::ios::binary);
  std::string magic;
  Image img;
  int maxval = 0;
  f >> magic >> img.width >> img.height >> maxval;
  f.get();  // the single whitespace after the header
  EXPECT_EQ(magic, "P6");
  EXPECT_EQ(maxval, 255);
  img.rgb.resize(static_cast<size_t>(img.width) * img.height * 3);
  f.read(reinterpret_cast<char*>(img.rgb.data()), static_cast<std::streamsize>(img.rgb.size()));
  EXPECT_EQ(f.gcount(), static_cast<std::streamsize>(img.rgb.size()));
  return img;
}

// Pixels in [x0, x1) that are not white, and those within `tol` of colour #rrggbb.
struct Count {
  long ink = 0, colour = 0;
};
Count count(const Image& img, int x0, int x1, unsigned colour, int tol = 10) {
  Count c;
  const int cr = (colour >> 16) & 255, cg = (colour >> 8) & 255, cb = colour & 255;
  for (int y = 0; y < img.height; ++y)
    for (int x = x0; x < x1; ++x) {
      const unsigned char* p = img.at(x, y);
      if (p[0] < 245 || p[1] < 245 || p[2] < 245) ++c.ink;
      if (std::abs(p[0] - cr) <= tol && std::abs(p[1] - cg) <= tol && std::abs(p[2] - cb) <= tol)
        ++c.colour;
    }
  return c;
}

int svg_height(const std::string& svg) {
  const auto p = svg.find("height=\"");
  return std::atoi(svg.c_str() + p + 8);
}

}  // namespace

TEST(ReportFormat, OneSpellingPerNumber) {
  EXPECT_EQ(format_seconds(41.852), "41.85 s");
  EXPECT_EQ(format_seconds(0.0853), "85.3 ms");
  EXPECT_EQ(format_seconds(0.00042), "420 us");
  EXPECT_EQ(report::fmt_gbps(4315.2), "4315 GB/s");
  EXPECT_EQ(report::fmt_gflops(12.56), "12.6 GFLOP/s");
  EXPECT_EQ(report::fmt_intensity(1.0 / 12), "0.0833 FLOP/B");
  EXPECT_EQ(report::fmt_ratio(10.2078), "10.2x");
  EXPECT_EQ(report::speedup_sentence(0.5), "restore is 2.00x slower than cold start");
  EXPECT_EQ(report::xml_escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
}

TEST(ReportTable, ContainsTheNumbers) {
  const TransientReport r = sample();
  const std::string t = render_table(r);
  for (const char* s :
       {"NVIDIA H200", "4315 GB/s", "59001 GFLOP/s", "480000 GFLOP/s", "13.7 FLOP/B", "2.50 FLOP/B",
        "memory-bound", "7000 GFLOP/s", "41.85 s", "4.10 s", "10.71 s", "criu_restore_tasks",
        "cuda_checkpoint", "median run of 3", "min 40.90 s",
        "restore is 10.2x faster than cold start"})
    EXPECT_NE(t.find(s), std::string::npos) << "missing '" << s << "' in\n" << t;
  ASSERT_TRUE(restore_speedup(r));
  EXPECT_NEAR(*restore_speedup(r), 41.852 / 4.1, 1e-9);
}

TEST(ReportTable, SaysWhatIsMissing) {
  TransientReport r;
  r.restore = make_timeline({{"criu_restore", 0, 1}});
  const std::string t = render_table(r);
  EXPECT_NE(t.find("roofline: not measured"), std::string::npos);
  EXPECT_NE(t.find("cold start (decision -> first token): not measured"), std::string::npos);
  EXPECT_EQ(t.find("faster"), std::string::npos);
  EXPECT_FALSE(restore_speedup(r));
}

TEST(ReportJson, RoundTrips) {
  const TransientReport r = sample();
  const std::string j = render_json(r).dump(2);
  // Its members in the order written, the document's kind first.
  EXPECT_EQ(j.rfind("{\n  \"ok\": true,\n  \"kind\": \"transient_report\",\n  \"ceilings\"", 0), 0u)
      << j.substr(0, 80);
  const TransientReport back = parse_report_json(j);
  EXPECT_EQ(back.ceilings.target, "gpu");
  EXPECT_EQ(back.ceilings.device_name, "NVIDIA H200");
  EXPECT_EQ(back.ceilings.bandwidth_gbps, 4315.2);
  EXPECT_EQ(back.ceilings.fp32_gflops, 59001.2);
  EXPECT_EQ(*back.ceilings.tensor_gflops, 480000.0);
  EXPECT_EQ(back.ceilings.method, r.ceilings.method);
  EXPECT_EQ(back.ceilings.details, r.ceilings.details);
  ASSERT_TRUE(back.workload);
  EXPECT_EQ(back.workload->intensity, 2.5);
  EXPECT_EQ(back.workload->attainable_gflops, r.workload->attainable_gflops);
  EXPECT_EQ(back.workload->memory_bound, r.workload->memory_bound);
  EXPECT_EQ(*back.workload->achieved_gflops, 7000.0);
  expect_same_timeline(*back.cold_start, *r.cold_start);
  expect_same_timeline(*back.restore, *r.restore);
  expect_same_timeline(*back.migration, *r.migration);
  EXPECT_EQ(back.cold_start_runs, r.cold_start_runs);
  // Rendering is deterministic, and a second round trip changes nothing.
  EXPECT_EQ(render_json(r).dump(2), j);
  EXPECT_EQ(render_json(parse_report_json(render_json(back).dump())), render_json(back));
  EXPECT_EQ(nlohmann::json::parse(j).at("restore_speedup").get<double>(), *restore_speedup(r));
}

TEST(ReportJson, BenchDocumentsRoundTripWithTheMedianRun) {
  std::vector<Timeline> runs = {make_timeline({{"spawn", 0, 0.5}, {"ready", 0.5, 0.5}}),
                                make_timeline({{"spawn", 0, 0.5}, {"ready", 0.5, 2.5}}),
                                make_timeline({{"spawn", 0, 0.5}, {"ready", 0.5, 1.5}})};
  EXPECT_NEAR(median_run(runs).total_seconds(), 2.0, 1e-9);
  const auto doc = bench_json("coldstart", runs, {{"command", {"srv"}}});
  EXPECT_EQ(doc.at("kind"), "coldstart");
  EXPECT_EQ(doc.at("command")[0], "srv");
  EXPECT_EQ(doc.at("runs").size(), 3u);
  EXPECT_NEAR(doc.at("summary").at("median_seconds").get<double>(), 2.0, 1e-9);
  EXPECT_NEAR(doc.at("summary").at("min_seconds").get<double>(), 1.0, 1e-9);
  EXPECT_NEAR(doc.at("timeline").at("total_seconds").get<double>(), 2.0, 1e-9);

  TransientReport r;
  EXPECT_EQ(load_bench_json(doc.dump(), r), "coldstart");
  ASSERT_TRUE(r.cold_start);
  EXPECT_NEAR(r.cold_start->total_seconds(), 2.0, 1e-8);
  ASSERT_EQ(r.cold_start_runs.size(), 3u);
  EXPECT_NEAR(r.cold_start_runs[1], 3.0, 1e-8);
  EXPECT_EQ(load_bench_json(bench_json("restore", {runs[0]}).dump(), r, "restore"), "restore");
  EXPECT_NEAR(r.restore->total_seconds(), 1.0, 1e-8);
}

TEST(ReportJson, BadDocumentsNameTheirSource) {
  TransientReport r;
  const auto msg_of = [&](auto f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidInput);
      return std::string(e.what());
    }
    ADD_FAILURE() << "accepted";
    return std::string();
  };
  EXPECT_NE(msg_of([&] { load_bench_json("{not json", r, "", "cs.json"); }).find("cs.json"),
            std::string::npos);
  EXPECT_NE(msg_of([&] {
              load_bench_json(bench_json("restore", {make_timeline({{"a", 0, 1}})}).dump(), r,
                              "coldstart", "x.json");
            }).find("expected 'coldstart'"),
            std::string::npos);
  EXPECT_NE(msg_of([&] {
              load_bench_json(R"({"ok":false,"error":{"code":"kCriu","message":"criu died"}})", r,
                              "", "e.json");
            }).find("criu died"),
            std::string::npos);
  msg_of(
      [&] { load_bench_json(R"({"kind":"coldstart","timeline":{"stages":[{"seconds":1}]}})", r); });
  msg_of([&] {
    load_bench_json(R"({"kind":"coldstart","timeline":{"stages":[{"name":"a","seconds":-1}]}})", r);
  });
  msg_of([&] { load_roofline_json(R"({"kind":"coldstart"})", r); });
  msg_of([&] {
    load_roofline_json(
        R"({"kind":"roofline","ceilings":{"target":"cpu","bandwidth_gbps":0,"fp32_gflops":1}})", r);
  });
  msg_of([&] { parse_report_json("[]"); });
  EXPECT_FALSE(r.cold_start);  // nothing half-loaded
}

// A flag given as anything but true or false is refused with its name, in every place a
// document holds one: not read as false, and not a JSON library's type_error.
TEST(ReportJson, FlagsThatAreNotTrueOrFalseAreRefusedByName) {
  const nlohmann::json good = nlohmann::json(render_json(sample()));
  ASSERT_TRUE(good.at("restore").contains("context")) << good.dump();
  const auto refusal = [](const nlohmann::json& doc) {
    try {
      parse_report_json(doc.dump(), "r.json");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::kInvalidInput);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  for (const char* flag : {"huge_pages", "adaptive_compression"}) {
    nlohmann::json doc = good;
    doc["restore"]["context"][flag] = "yes";
    const std::string why = refusal(doc);
    EXPECT_NE(why.find(std::string("'") + flag + "' is not true or false"), std::string::npos)
        << why;
    EXPECT_NE(why.find("r.json"), std::string::npos) << why;
  }
  nlohmann::json doc = good;
  doc["workload"]["memory_bound"] = 1;
  EXPECT_NE(refusal(doc).find("'memory_bound' is not true or false"), std::string::npos);
  doc["workload"]["memory_bound"] = true;  // and the real thing still reads
  EXPECT_TRUE(parse_report_json(doc.dump()).workload->memory_bound);
}

TEST(ReportJson, RooflineDocumentRoundTrips) {
  const TransientReport s = sample();
  KernelMeasurement k;
  k.name = "matmul";
  k.intensity = 64;
  k.achieved_gflops = 30;
  const std::string doc = roofline_json(s.ceilings, s.workload, k).dump();
  EXPECT_EQ(nlohmann::json::parse(doc).at("kernel").at("name"), "matmul");
  TransientReport r;
  load_roofline_json(doc, r);
  EXPECT_EQ(r.ceilings.bandwidth_gbps, 4315.2);
  EXPECT_EQ(*r.ceilings.tensor_gflops, 480000.0);
  ASSERT_TRUE(r.workload);
  EXPECT_EQ(*r.workload->achieved_gflops, 7000.0);
  TransientReport none;
  load_roofline_json(roofline_json(s.ceilings, std::nullopt).dump(), none);
  EXPECT_FALSE(none.workload);
}

TEST(ReportSvg, HasTheLabelsAndIsDeterministic) {
  const TransientReport r = sample();
  const std::string svg = render_svg(r);
  EXPECT_EQ(svg, render_svg(sample()));
  for (const char* s : {"cold start",
                        "restore",
                        "migration",
                        "memory 4315 GB/s",
                        "FP32 peak 59001 GFLOP/s",
                        "tensor peak 480000 GFLOP/s",
                        "workload",
                        "2.50 FLOP/B, 7000 GFLOP/s achieved",
                        "attainable 10788 GFLOP/s",
                        "memory-bound",
                        "ridge 13.7 FLOP/B",
                        "41.85 s",
                        "4.10 s",
                        "10.71 s",
                        "restore is 10.2x faster than cold start",
                        "first_answer",
                        "criu_restore_tasks",
                        "arithmetic intensity",
                        "1k",
                        "100k"})
    EXPECT_NE(svg.find(s), std::string::npos) << "missing '" << s << "'";
  // Self-contained: nothing fetched, nothing run.
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("href"), std::string::npos);
  EXPECT_EQ(svg.find("<image"), std::string::npos);
}

TEST(ReportSvg, RendersToAPngWithInkInBothHalves) {
  auto dir = test::scratch_dir();
  const std::string svg = render_svg(sample());
  const Image img = render_png_and_decode(svg, dir.path());
  EXPECT_EQ(img.width, 1200);
  EXPECT_EQ(img.height, svg_height(svg));
  const Count left = count(img, 0, 600, 0x1f4e79), right = count(img, 600, 1200, 0x59a14f);
  const long half = 600L * img.height;
  EXPECT_GT(left.ink, half / 50) << "the roofline half is (nearly) blank";
  EXPECT_GT(right.ink, half / 50) << "the bars half is (nearly) blank";
  EXPECT_GT(left.colour, 300) << "no roof line drawn in the roof colour";
  EXPECT_GT(right.colour, 100) << "no first_answer segment in its colour";
  EXPECT_GT(count(img, 0, 600, 0xc0392b).colour, 50) << "no workload point";
}

TEST(ReportSvg, EmptyReportStillRendersAndSaysNotMeasured) {
  auto dir = test::scratch_dir();
  const std::string svg = render_svg(TransientReport{});
  EXPECT_NE(svg.find("roofline not measured"), std::string::npos);
  EXPECT_NE(svg.find("not measured"), std::string::npos);
  const Image img = render_png_and_decode(svg, dir.path());
  EXPECT_EQ(img.width, 1200);
  EXPECT_GT(count(img, 0, 600, 0).ink, 1000);
}

TEST(ReportSvg, CpuReportWithoutTensorOrWorkload) {
  TransientReport r;
  r.ceilings.target = "cpu";
  r.ceilings.device_name = "AMD EPYC";
  r.ceilings.bandwidth_gbps = 19.5;
  r.ceilings.fp32_gflops = 230;
  r.restore = make_timeline({{"read_decompress", 0, 0.2}, {"criu_restore", 0.2, 0.3}});
  const std::string svg = render_svg(r);
  EXPECT_NE(svg.find("memory 19.5 GB/s"), std::string::npos);
  EXPECT_NE(svg.find("FP32 peak 230 GFLOP/s"), std::string::npos);
  EXPECT_EQ(svg.find("tensor peak"), std::string::npos);
  EXPECT_EQ(svg.find("faster than"), std::string::npos);
  auto dir = test::scratch_dir();
  const Image img = render_png_and_decode(svg, dir.path());
  EXPECT_GT(count(img, 0, 600, 0x1f4e79).colour, 300);
}

TEST(ReportHtml, EmbedsTheChartAndTheTable) {
  const std::string html = render_html(sample());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("restore is 10.2x faster than cold start"), std::string::npos);
  EXPECT_NE(html.find("criu_restore_tasks"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
}
