// `gpuckpt bench io`: pack/unpack throughput against what an operator would use instead
// (tar | zstd -T0, and plain cp), on the same generated data, in one run, with the page cache
// dropped before every measurement and every output fsync()ed.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "commands.h"
#include "gpuckpt/bench.h"

namespace fs = std::filesystem;

namespace gpuckpt::cli {

namespace {

// Content like a serving process's memory: the first `random_fraction` incompressible
// (weights in a compressed format, random state), the rest fp16 activations/KV values of
// similar magnitude (shared exponent, low-entropy mantissa), which compress about 2:1.
void generate_file(const fs::path& path, std::uint64_t size, std::uint64_t seed,
                   double random_fraction) {
  const UniqueFd owned(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!owned) throw_errno(Errc::kIo, "create ", path);
  const int fd = owned.get();
  SampleContent content(seed);
  std::vector<std::byte> buf(4 << 20);
  const auto random_bytes = static_cast<std::uint64_t>(static_cast<double>(size) * random_fraction);
  std::uint64_t written = 0;
  while (written < size) {
    content.fill(buf, written < random_bytes);
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), size - written));
    std::size_t off = 0;
    while (off < n) {
      const ssize_t w = ::write(fd, reinterpret_cast<const char*>(buf.data()) + off, n - off);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw_errno(Errc::kIo, "write ", path);
      }
      off += static_cast<std::size_t>(w);
    }
    written += n;
  }
  if (::fsync(fd) != 0) throw_errno(Errc::kIo, "fsync ", path);
}

// A CRIU-like image directory: one big pages file and a few dozen small images.
void generate_tree(const fs::path& dir, std::uint64_t size) {
  fs::create_directories(dir);
  std::uint64_t small_total = 0;
  for (int i = 0; i < 32; ++i) {
    const std::uint64_t n = 1024 + (static_cast<std::uint64_t>(i) * 7919 % 61) * 1024;
    if (small_total + n > size / 8) break;
    generate_file(dir / ("img-" + std::to_string(i) + ".img"), n, 100 + i, 0.25);
    small_total += n;
  }
  generate_file(dir / "pages-1.img", size - small_total, 1, 0.5);
}

std::string quote(const fs::path& p) {
  return shell_quote(p.string());
}

// Whether `tool` is on PATH.
bool have(const std::string& tool) {
  return run_shell("command -v " + tool + " >/dev/null 2>&1") == 0;
}

bool drop_caches() {
  ::sync();
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "3", 1) == 1;
  ::close(fd);
  return ok;
}

std::uint64_t dir_bytes(const fs::path& p) {
  std::error_code ec;
  if (fs::is_regular_file(p, ec)) return fs::file_size(p, ec);
  std::uint64_t n = 0;
  for (auto it = fs::recursive_directory_iterator(p, ec); !ec && it != fs::end(it);
       it.increment(ec))
    if (it->is_regular_file(ec)) n += it->file_size(ec);
  return n;
}

struct Row {
  std::string op, tool;
  std::optional<double> seconds;  // nullopt: not run (tool missing or failed)
  std::uint64_t stored = 0;       // output bytes, for the ratio (pack only)
  std::string note;
};

struct WorkDir {
  fs::path path;
  bool keep = false;
  ~WorkDir() {
    std::error_code ec;
    if (!keep && !path.empty()) fs::remove_all(path, ec);
  }
};

template <class F>
double timed(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct BenchArgs {
  std::uint64_t size = 2ull << 30;
  std::string dir;
  int level = 1;
  unsigned threads = 0;
  std::uint64_t chunk = 4u << 20;
  bool keep = false;
};

// Checks --size and --dir, then makes the working directory under it.
fs::path make_work_dir(const BenchArgs& a) {
  if (a.size < (1u << 20)) throw Error(Errc::kUsage, "--size must be at least 1M");
  fs::path base = a.dir;
  if (base.empty()) base = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/var/tmp";
  std::error_code ec;
  if (!fs::is_directory(base, ec))
    throw Error(Errc::kInvalidInput, "--dir " + base.string() + " is not a directory");
  struct statvfs vfs {};
  if (::statvfs(base.c_str(), &vfs) == 0) {
    // Source, checkpoint, tar.zst and one output at a time.
    const std::uint64_t need = a.size * 9 / 2;
    const std::uint64_t avail = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (avail < need)
      throw Error(Errc::kInvalidInput, "--dir " + base.string() + " has " + human_bytes(avail) +
                                           " free; the benchmark needs about " + human_bytes(need));
  }
  std::string tmpl = (base / "gpuckpt-bench-io-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw_errno(Errc::kIo, "mkdtemp in ", base);
  return tmpl;
}

// One run of the benchmark: the generated source, then each tool's pack and unpack, timed
// from a cold page cache, in `rows`.
class IoBench {
 public:
  IoBench(const BenchArgs& a, const fs::path& work)
      : a_(a),
        work_(work),
        src_(work / "src"),
        tarzst_(work / "src.tar.zst"),
        lvl_(std::to_string(a.level)) {
    spdlog::info("bench io: generating {} of test data in {}", human_bytes(a.size), src_.string());
    generate_tree(src_, a.size);
    raw = dir_bytes(src_);
    threads = a.threads ? a.threads : usable_cpus();
    have_zstd_ = have("zstd") && have("tar");
  }

  void pack_all() {
    PackOptions po;
    po.zstd_level = a_.level;
    po.threads = threads;
    po.chunk_bytes = static_cast<std::uint32_t>(a_.chunk);
    spdlog::info("bench io: pack with gpuckpt");
    cold();
    const double t = timed([&] { packed = pack(src_, ckpt(), po); });
    rows.push_back({"pack", "gpuckpt", t, packed.compressed_bytes, ""});

    const std::string tool = "tar | zstd -T0 -" + lvl_;
    if (have_zstd_) {
      spdlog::info("bench io: pack with tar | zstd");
      cold();
      const double tz = timed([&] {
        sh("tar -cf - -C " + quote(work_) + " src | zstd -q -T0 -" + lvl_ + " -o " +
               quote(tarzst_) + " && sync " + quote(tarzst_),
           "tar | zstd");
      });
      rows.push_back({"pack", tool, tz, fs::file_size(tarzst_), ""});
    } else {
      rows.push_back({"pack", tool, std::nullopt, 0, "zstd or tar not installed"});
    }
    cp_run("pack");
  }

  void unpack_all() {
    const fs::path out = work_ / "unpacked";
    UnpackOptions uo;
    uo.threads = threads;
    spdlog::info("bench io: unpack with gpuckpt");
    cold();
    const double t = timed([&] { unpacked = unpack(ckpt(), out, uo); });
    rows.push_back({"unpack", "gpuckpt", t, 0, ""});
    if (run_shell("cmp -s " + quote(src_ / "pages-1.img") + " " + quote(out / "pages-1.img")) != 0)
      throw Error(Errc::kInternal, "bench io: gpuckpt unpack produced different bytes");
    fs::remove_all(out);

    if (have_zstd_) {
      const fs::path untar = work_ / "untar";
      fs::create_directories(untar);
      spdlog::info("bench io: unpack with zstd -d | tar -x");
      cold();
      const double tz = timed([&] {
        sh("zstd -q -d -c " + quote(tarzst_) + " | tar -xf - -C " + quote(untar) + " && sync " +
               quote(untar / "src") + "/*",
           "zstd -d | tar -x");
      });
      fs::remove_all(untar);
      rows.push_back({"unpack", "zstd -d | tar -x", tz, 0, ""});
    } else {
      rows.push_back({"unpack", "zstd -d | tar -x", std::nullopt, 0, "zstd or tar not installed"});
    }
    cp_run("unpack");
  }

  // gpuckpt's time over the first tool whose name starts with `other`, for `op`.
  std::optional<double> ratio(const char* op, const std::string& other) const {
    const auto ours = secs(op, "gpuckpt"), theirs = secs(op, other);
    if (!ours || !theirs || *theirs <= 0) return std::nullopt;
    return *ours / *theirs;
  }

  std::vector<Row> rows;
  std::uint64_t raw = 0;
  unsigned threads = 0;
  bool dropped = true;  // the page cache was dropped before every measurement
  TransferResult packed, unpacked;

 private:
  fs::path ckpt() const { return work_ / "ckpt"; }
  void cold() { dropped = drop_caches() && dropped; }
  static void sh(const std::string& cmd, const char* what) {
    if (run_shell(cmd) != 0)
      throw Error(Errc::kIo, std::string("bench io: ") + what + " failed: " + cmd);
  }
  void cp_run(const char* op) {
    const fs::path dst = work_ / "cp-out";
    spdlog::info("bench io: {} baseline with cp", op);
    cold();
    const double t = timed([&] {
      sh("cp -r " + quote(src_) + " " + quote(dst) + " && sync " + quote(dst) + "/*", "cp");
    });
    fs::remove_all(dst);
    rows.push_back({op, "cp", t, 0, ""});
  }
  std::optional<double> secs(const char* op, const std::string& tool_prefix) const {
    for (const auto& r : rows)
      if (r.op == op && r.tool.rfind(tool_prefix, 0) == 0) return r.seconds;
    return std::nullopt;
  }

  const BenchArgs& a_;
  fs::path work_, src_, tarzst_;
  std::string lvl_;
  bool have_zstd_ = false;
};

struct IoRatios {
  std::optional<double> pack_vs_zstd, pack_vs_cp, unpack_vs_zstd, unpack_vs_cp;
  explicit IoRatios(const IoBench& b)
      : pack_vs_zstd(b.ratio("pack", "tar")),
        pack_vs_cp(b.ratio("pack", "cp")),
        unpack_vs_zstd(b.ratio("unpack", "zstd")),
        unpack_vs_cp(b.ratio("unpack", "cp")) {}
};

void emit_json(const Context& ctx, const BenchArgs& a, const IoBench& b, const fs::path& work) {
  const IoRatios q(b);
  nlohmann::json results = nlohmann::json::array();
  for (const auto& r : b.rows) {
    nlohmann::json j = {{"op", r.op}, {"tool", r.tool}};
    if (r.seconds) {
      j["seconds"] = *r.seconds;
      j["gbps"] = double(b.raw) / *r.seconds / 1e9;
    } else {
      j["seconds"] = nullptr;
      j["note"] = r.note;
    }
    if (r.stored) j["ratio"] = double(b.raw) / double(r.stored);
    results.push_back(std::move(j));
  }
  auto opt = [](std::optional<double> v) {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  auto met = [](std::optional<double> v, double limit) {
    return v ? nlohmann::json(*v <= limit) : nlohmann::json(nullptr);
  };
  const TransferResult& pr = b.packed;
  const TransferResult& ur = b.unpacked;
  ctx.emit({{"ok", true},
            {"command", "bench io"},
            {"bytes", b.raw},
            {"dir", work.string()},
            {"zstd_level", a.level},
            {"threads", b.threads},
            {"chunk_bytes", a.chunk},
            {"page_cache_dropped", b.dropped},
            {"results", std::move(results)},
            {"ratios",
             {{"pack_gpuckpt_vs_zstd", opt(q.pack_vs_zstd)},
              {"pack_gpuckpt_vs_cp", opt(q.pack_vs_cp)},
              {"unpack_gpuckpt_vs_zstd", opt(q.unpack_vs_zstd)},
              {"unpack_gpuckpt_vs_cp", opt(q.unpack_vs_cp)}}},
            {"targets",
             {{"pack_at_least_zstd_speed", met(q.pack_vs_zstd, 1.0)},
              {"unpack_at_least_zstd_speed", met(q.unpack_vs_zstd, 1.0)},
              {"unpack_within_1_3x_cp", met(q.unpack_vs_cp, 1.3)}}},
            {"pack",
             {{"ratio", pr.compressed_bytes ? double(b.raw) / double(pr.compressed_bytes) : 0},
              {"io_uring", pr.io_uring},
              {"direct_io", pr.direct_io},
              {"timeline", timeline_json(pr.timeline)}}},
            {"unpack",
             {{"io_uring", ur.io_uring},
              {"direct_io", ur.direct_io},
              {"timeline", timeline_json(ur.timeline)}}}});
}

void print_human(const BenchArgs& a, const IoBench& b, const fs::path& work) {
  const IoRatios q(b);
  std::printf(
      "gpuckpt bench io: %s (pages-1.img + small images), zstd level %d, %u threads, "
      "%s chunks\n",
      human_bytes(b.raw).c_str(), a.level, b.threads, human_bytes(a.chunk).c_str());
  std::printf("data in %s; page cache %s before each run; every output fsync()ed\n\n", work.c_str(),
              b.dropped ? "dropped" : "NOT dropped (need root)");
  std::printf("%-7s %-20s %9s %8s %7s\n", "op", "tool", "seconds", "GB/s", "ratio");
  for (const auto& r : b.rows) {
    if (!r.seconds) {
      std::printf("%-7s %-20s %9s %8s %7s  (%s)\n", r.op.c_str(), r.tool.c_str(), "-", "-", "-",
                  r.note.c_str());
      continue;
    }
    char ratio[16] = "-";
    if (r.stored) std::snprintf(ratio, sizeof ratio, "%.3f", double(b.raw) / double(r.stored));
    std::printf("%-7s %-20s %9.2f %8.2f %7s\n", r.op.c_str(), r.tool.c_str(), *r.seconds,
                double(b.raw) / *r.seconds / 1e9, ratio);
  }
  auto line = [](const char* what, std::optional<double> v, double target) {
    if (!v) {
      std::printf("  %-34s %7s\n", what, "n/a");
      return;
    }
    std::printf("  %-34s %6.2fx  (target <= %.1fx: %s)\n", what, *v, target,
                *v <= target ? "met" : "NOT met");
  };
  std::printf("\ntime ratios (lower is better for gpuckpt):\n");
  line("pack   gpuckpt / tar|zstd", q.pack_vs_zstd, 1.0);
  line("unpack gpuckpt / zstd -d|tar", q.unpack_vs_zstd, 1.0);
  line("unpack gpuckpt / cp", q.unpack_vs_cp, 1.3);
  if (q.pack_vs_cp) std::printf("  %-34s %6.2fx\n", "pack   gpuckpt / cp", *q.pack_vs_cp);
  std::printf("\ngpuckpt pack stages (%s, %s):\n", b.packed.io_uring ? "io_uring" : "pread/pwrite",
              b.packed.direct_io ? "O_DIRECT" : "page cache");
  print_stages(b.packed.timeline);
  std::printf("\ngpuckpt unpack stages:\n");
  print_stages(b.unpacked.timeline);
}

void run_bench_io(const Context& ctx, const BenchArgs& a) {
  const WorkDir work{make_work_dir(a), a.keep};
  IoBench b(a, work.path);
  b.pack_all();
  b.unpack_all();
  if (ctx.json)
    emit_json(ctx, a, b, work.path);
  else
    print_human(a, b, work.path);
}

}  // namespace

void add_bench_io(CLI::App& bench, Context& ctx) {
  auto a = std::make_shared<BenchArgs>();
  auto* cmd = bench.add_subcommand(
      "io", "Pack/unpack throughput vs tar|zstd -T0 and cp (drops the page cache; run as root)");
  cmd->add_option("--size", a->size, "Bytes of generated data, e.g. 2G")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--dir", a->dir, "Where to put the data (default $TMPDIR or /var/tmp)");
  cmd->add_option("--level", a->level, "zstd level for both gpuckpt and zstd");
  cmd->add_option("--threads", a->threads, "gpuckpt worker threads (0 = one per CPU, like -T0)");
  cmd->add_option("--chunk-size", a->chunk, "gpuckpt chunk size")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_flag("--keep", a->keep, "Keep the generated data and outputs");
  cmd->fallthrough();
  cmd->callback([&ctx, a] { run_bench_io(ctx, *a); });
}

}  // namespace gpuckpt::cli
