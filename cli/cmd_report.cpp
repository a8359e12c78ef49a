// `gpuckpt report`: the transient report from the benchmarks' and the roofline's --json output:
// a table (or JSON) on stdout, and the chart as SVG and/or self-contained HTML.
#include <spdlog/spdlog.h>

#include <iostream>

#include "commands.h"

namespace gpuckpt::cli {

namespace {

struct ReportArgs {
  std::string input;  // a previous `gpuckpt report --json`
  std::string coldstart, restore, migrate, roofline;
  bool measure = false, quick = false;
  std::string target = "auto";
  std::optional<double> intensity, achieved;
  std::string svg, html;
};

void run_report(const ReportArgs& a, Context& ctx) {
  if (a.input.empty() && a.coldstart.empty() && a.restore.empty() && a.migrate.empty() &&
      a.roofline.empty() && !a.measure)
    throw Error(Errc::kUsage,
                "nothing to report: give --coldstart, --restore, --migrate, --roofline, "
                "--measure or --input");
  if (a.achieved && !a.intensity)
    throw Error(Errc::kUsage, "--achieved needs --intensity (where the workload sits)");

  TransientReport r;
  if (!a.input.empty()) r = parse_report_json(read_report_input(a.input), a.input);
  if (!a.coldstart.empty())
    load_bench_json(read_report_input(a.coldstart), r, "coldstart", a.coldstart);
  if (!a.restore.empty()) load_bench_json(read_report_input(a.restore), r, "restore", a.restore);
  if (!a.migrate.empty()) load_bench_json(read_report_input(a.migrate), r, "migrate", a.migrate);
  if (!a.roofline.empty()) load_roofline_json(read_report_input(a.roofline), r, a.roofline);
  if (a.measure) {
    MeasureOptions mo;
    mo.quick = a.quick;
    r.ceilings = measure_ceilings(parse_roofline_target(a.target), mo);
    r.workload.reset();
  }
  if (a.intensity) {
    if (r.ceilings.target.empty())
      throw Error(Errc::kUsage, "--intensity needs ceilings: add --roofline FILE or --measure");
    r.workload = place_on_roofline(r.ceilings, *a.intensity, a.achieved);
  }

  // Charts first: a failed write must not leave a table on stdout that looks like success.
  if (!a.svg.empty()) {
    write_report_output(a.svg, render_svg(r));
    spdlog::info("wrote {}", a.svg);
  }
  if (!a.html.empty()) {
    write_report_output(a.html, render_html(r));
    spdlog::info("wrote {}", a.html);
  }
  if (ctx.json)
    ctx.emit_ordered(render_json(r));
  else
    std::cout << render_table(r);
}

}  // namespace

void add_report_commands(CLI::App& app, Context& ctx) {
  auto a = std::make_shared<ReportArgs>();
  auto* cmd = app.add_subcommand(
      "report",
      "Transient report: cold start vs restore vs migration, per stage, beside the "
      "roofline (table, JSON, SVG, HTML)");
  cmd->add_option("--coldstart", a->coldstart, "Output of `gpuckpt --json bench coldstart`")
      ->check(CLI::ExistingFile);
  cmd->add_option("--restore", a->restore, "Output of `gpuckpt --json bench restore`")
      ->check(CLI::ExistingFile);
  cmd->add_option("--migrate", a->migrate, "Output of `gpuckpt --json bench migrate`")
      ->check(CLI::ExistingFile);
  auto* roof = cmd->add_option("--roofline", a->roofline, "Output of `gpuckpt --json roofline`")
                   ->check(CLI::ExistingFile);
  auto* measure = cmd->add_flag("--measure", a->measure, "Measure the roofline ceilings now");
  roof->excludes(measure);
  cmd->add_option("--input", a->input, "A previous `gpuckpt --json report` to start from")
      ->check(CLI::ExistingFile);
  cmd->add_option("--target", a->target, "With --measure: auto, cpu or gpu")
      ->check(CLI::IsMember({"auto", "cpu", "gpu"}));
  cmd->add_flag("--quick", a->quick, "With --measure: faster, less precise ceilings");
  cmd->add_option("--intensity", a->intensity, "Place a workload: FLOP per byte")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--achieved", a->achieved, "The workload's measured GFLOP/s")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--svg", a->svg, "Write the chart as SVG (replaced atomically)");
  cmd->add_option("--html", a->html, "Write a self-contained HTML page (chart + table)");
  cmd->fallthrough();  // global flags (--json, -q) may also follow the command
  cmd->callback([a, &ctx] { run_report(*a, ctx); });
}

}  // namespace gpuckpt::cli
