// `gpuckpt pack|unpack|inspect|verify`: the checkpoint image commands.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "flags.h"
#include "gpuckpt/support.h"

namespace gpuckpt::cli {

namespace {

struct IoArgs {
  unsigned threads = 0;
  unsigned queue_depth = 16;
  unsigned inflight = 0;
  bool no_direct = false;

  // PackOptions and UnpackOptions share these fields.
  template <class Options>
  void apply(Options& o) const {
    o.threads = threads;
    o.queue_depth = queue_depth;
    o.inflight_chunks = inflight;
    o.direct_io = !no_direct;
  }
};

void add_io_options(CLI::App& cmd, IoArgs& a) {
  cmd.add_option("--threads", a.threads, "Worker threads (0 = one per CPU)")
      ->check(CLI::Range(0u, 1024u));
  cmd.add_option("--queue-depth", a.queue_depth, "io_uring queue depth")
      ->check(CLI::Range(1u, 4096u));
  cmd.add_option("--inflight", a.inflight,
                 "Chunk buffers in flight, bounds memory (0 = auto: 2 x threads + 8)");
  cmd.add_flag("--no-direct", a.no_direct, "Do not use O_DIRECT (always use the page cache)");
  cmd.fallthrough();  // global options (--json, -q) are accepted after the subcommand too
}

double ratio(std::uint64_t raw, std::uint64_t stored) {
  return stored ? static_cast<double>(raw) / static_cast<double>(stored) : 0.0;
}

double gbps(std::uint64_t bytes, const Timeline& t) {
  const double s = t.total_seconds();
  return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0.0;
}

nlohmann::json result_json(const char* command, const TransferResult& r) {
  return {{"ok", true},
          {"command", command},
          {"raw_bytes", r.raw_bytes},
          {"compressed_bytes", r.compressed_bytes},
          {"ratio", ratio(r.raw_bytes, r.compressed_bytes)},
          {"skipped_compression_bytes", r.skipped_compression_bytes},
          {"chunks", r.chunks},
          {"files", r.files},
          {"threads", r.threads},
          {"buffer_bytes", r.buffer_bytes},
          {"worker_busy_seconds", r.worker_busy_seconds},
          {"io_uring", r.io_uring},
          {"direct_io", r.direct_io},
          {"gbps", gbps(r.raw_bytes, r.timeline)},
          {"timeline", timeline_json(r.timeline)}};
}

void print_summary(const char* verb, const TransferResult& r) {
  std::printf("%s %s raw / %s stored (ratio %.2f) in %s: %.2f GB/s\n", verb,
              human_bytes(r.raw_bytes).c_str(), human_bytes(r.compressed_bytes).c_str(),
              ratio(r.raw_bytes, r.compressed_bytes),
              format_seconds(r.timeline.total_seconds()).c_str(), gbps(r.raw_bytes, r.timeline));
  if (r.skipped_compression_bytes > 0)
    std::printf(
        "%s stored uncompressed, so that the writes kept up (--compress always: all "
        "compressed)\n",
        human_bytes(r.skipped_compression_bytes).c_str());
  std::printf("%llu entries, %llu chunks, %u threads, %s, %s, %s chunk buffers\n\n",
              static_cast<unsigned long long>(r.files), static_cast<unsigned long long>(r.chunks),
              r.threads, r.io_uring ? "io_uring" : "pread/pwrite (no io_uring)",
              r.direct_io ? "O_DIRECT" : "page cache", human_bytes(r.buffer_bytes).c_str());
  print_stages(r.timeline);
}

void add_pack(CLI::App& app, Context& ctx) {
  struct Args {
    std::string input, output;
    int level = 1;
    CompressFlag compress;
    std::uint64_t chunk = 4u << 20;
    bool force = false;
    IoArgs io;
    SignFlags sign;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("pack", "Pack a directory (or one file) into a checkpoint");
  cmd->add_option("input", a->input, "Directory (e.g. a CRIU image dir) or file to pack")
      ->required();
  cmd->add_option("-o,--output", a->output, "Checkpoint directory to create")->required();
  cmd->add_option("--level", a->level, "zstd level (negative = faster, up to 19)");
  a->compress.add(cmd, "always, so that the same input packs to the same checkpoint");
  cmd->add_option("--chunk-size", a->chunk, "Chunk size, e.g. 4M (multiple of 4K, 64K..256M)")
      ->transform(CLI::AsSizeValue(false));
  cmd->add_flag("--force", a->force, "Replace an existing checkpoint");
  a->sign.add(cmd);
  add_io_options(*cmd, a->io);
  cmd->callback([&ctx, a] {
    PackOptions o;
    o.sign_key = a->sign.path();
    o.zstd_level = a->level;
    o.compression = a->compress.value();
    if (a->chunk > UINT32_MAX) throw Error(Errc::kUsage, "chunk size is too large");
    o.chunk_bytes = static_cast<std::uint32_t>(a->chunk);
    a->io.apply(o);
    o.force = a->force;
    o.progress = ctx.progress();
    const TransferResult r = pack(a->input, a->output, o);
    ctx.progress_done();
    if (ctx.json) {
      auto j = result_json("pack", r);
      j["input"] = a->input;
      j["output"] = a->output;
      j["signed"] = !o.sign_key.empty();
      ctx.emit(j);
    } else {
      std::printf("packed %s -> %s\n", a->input.c_str(), a->output.c_str());
      print_summary("  ", r);
    }
  });
}

void add_unpack(CLI::App& app, Context& ctx) {
  struct Args {
    std::string checkpoint, output;
    bool force = false;
    IoArgs io;
  };
  auto a = std::make_shared<Args>();
  auto* cmd =
      app.add_subcommand("unpack", "Unpack a checkpoint into a directory (every chunk verified)");
  cmd->add_option("checkpoint", a->checkpoint, "Checkpoint directory, or s3://BUCKET/PREFIX")
      ->required();
  cmd->add_option("-o,--output", a->output, "Directory to create")->required();
  cmd->add_flag("--force", a->force,
                "Replace an existing non-empty output directory (never a file or a symlink)");
  add_io_options(*cmd, a->io);
  cmd->callback([&ctx, a] {
    UnpackOptions o;
    a->io.apply(o);
    o.force = a->force;
    o.progress = ctx.progress();
    const TransferResult r = unpack(a->checkpoint, a->output, o);
    ctx.progress_done();
    if (ctx.json) {
      auto j = result_json("unpack", r);
      j["checkpoint"] = a->checkpoint;
      j["output"] = a->output;
      ctx.emit(j);
    } else {
      std::printf("unpacked %s -> %s\n", a->checkpoint.c_str(), a->output.c_str());
      print_summary("  ", r);
    }
  });
}

void add_verify(CLI::App& app, Context& ctx) {
  struct Args {
    std::string checkpoint;
    IoArgs io;
    TrustFlags trust;
  };
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "verify",
      "Check the manifest's seal and signature, every chunk checksum, and every file's xxh3");
  cmd->add_option("checkpoint", a->checkpoint,
                  "Checkpoint directory, or s3://BUCKET/PREFIX (downloaded, then verified)")
      ->required();
  a->trust.add(cmd, false);
  add_io_options(*cmd, a->io);
  cmd->callback([&ctx, a] {
    UnpackOptions o;
    a->io.apply(o);
    o.progress = ctx.progress();
    // The signature first: a checkpoint that fails it is not worth reading through.
    const TrustOptions trust = a->trust.options();
    const SignatureInfo sig = signature_status(a->checkpoint, trust.trusted_keys);
    enforce_signature(sig, trust, a->checkpoint);
    const TransferResult r = verify(a->checkpoint, o);
    ctx.progress_done();
    if (ctx.json) {
      auto j = result_json("verify", r);
      j["checkpoint"] = a->checkpoint;
      j["signature"] = signature_json(sig);
      ctx.emit(j);
    } else {
      std::printf("OK: %s verified\n", a->checkpoint.c_str());
      std::printf("  signature %s\n", signature_text(sig, trust.trusted_keys).c_str());
      print_summary("  ", r);
    }
  });
}

void add_inspect(CLI::App& app, Context& ctx) {
  auto checkpoint = std::make_shared<std::string>();
  auto keys = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "inspect", "Show a checkpoint's manifest and signature state (reads no blob)");
  cmd->add_option("checkpoint", *checkpoint,
                  "Checkpoint directory, or s3://BUCKET/PREFIX (only its manifest is fetched)")
      ->required();
  cmd->add_option("--trusted-keys", *keys,
                  "Public key file or directory of *.pub files to check the signer against "
                  "(default: trusted_keys in the gpuckpt config)");
  cmd->fallthrough();
  cmd->callback([&ctx, checkpoint, keys] {
    const ImageInfo info = inspect(*checkpoint);
    const std::filesystem::path trusted =
        keys->empty() ? load_security_config().trusted_keys : std::filesystem::path(*keys);
    const SignatureInfo sig = signature_status(*checkpoint, trusted);
    if (ctx.json) {
      nlohmann::json files = nlohmann::json::array();
      for (const auto& f : info.files) {
        nlohmann::json e = {
            {"path", f.path}, {"type", entry_type_name(f.type)}, {"mode", format_mode(f.mode)}};
        if (f.type == EntryType::kFile) {
          e["size"] = f.size;
          e["stored"] = f.compressed_size;
          e["chunks"] = f.chunks;
          e["xxh3"] = format_hex64(f.xxh3);
        } else if (f.type == EntryType::kSymlink) {
          e["target"] = f.target;
        }
        files.push_back(std::move(e));
      }
      ctx.emit({{"ok", true},
                {"command", "inspect"},
                {"checkpoint", *checkpoint},
                {"format_version", info.format_version},
                {"format_minor", info.format_minor},
                {"created_by", info.created_by},
                {"created_at", info.created_at},
                {"host", info.host},
                {"source", info.source},
                {"input_kind", info.input_kind},
                {"chunk_bytes", info.chunk_bytes},
                {"zstd_level", info.zstd_level},
                {"raw_bytes", info.raw_bytes},
                {"compressed_bytes", info.compressed_bytes},
                {"ratio", ratio(info.raw_bytes, info.compressed_bytes)},
                {"chunk_count", info.chunk_count},
                {"blob_count", info.blob_count},
                {"sealed", info.sealed},
                {"signature", signature_json(sig)},
                {"files", std::move(files)},
                {"extra", info.extra}});
      return;
    }
    std::printf("checkpoint   %s\n", checkpoint->c_str());
    std::printf("format       %u.%u\n", info.format_version, info.format_minor);
    std::printf("created      %s by %s on %s\n", info.created_at.c_str(), info.created_by.c_str(),
                info.host.empty() ? "?" : info.host.c_str());
    std::printf("source       %s (%s)\n", info.source.c_str(), info.input_kind.c_str());
    std::printf("compression  zstd level %d, %s chunks, xxh3-64 checksums\n", info.zstd_level,
                human_bytes(info.chunk_bytes).c_str());
    std::printf("size         %s raw, %s stored (ratio %.2f), %llu chunks in %llu blobs\n",
                human_bytes(info.raw_bytes).c_str(), human_bytes(info.compressed_bytes).c_str(),
                ratio(info.raw_bytes, info.compressed_bytes),
                static_cast<unsigned long long>(info.chunk_count),
                static_cast<unsigned long long>(info.blob_count));
    std::printf("checksum     %s\n", info.sealed ? "whole manifest, in manifest.seal"
                                                 : "none for the manifest (format 1.0)");
    std::printf("signature    %s\n", signature_text(sig, trusted).c_str());
    // A container's record, whole: what its restore needs here (rootfs, mount sources).
    std::optional<ContainerSummary> c;
    try {
      c = container_summary(info.extra);
    } catch (const Error& e) {
      // What else the manifest holds is still worth showing.
      std::printf("container    its record is unreadable: %s\n", e.what());
    }
    if (c) {
      std::printf("container    %s %s (runc root %s), bundle %s, rootfs %s\n",
                  container_runtime_name(c->runtime), c->id.c_str(), c->root.c_str(),
                  c->bundle.c_str(), c->rootfs.c_str());
      if (c->runtime == ContainerRuntime::kContainerd)
        std::printf("  image      %s (%s), namespace %s, snapshotter %s\n", c->image.c_str(),
                    c->image_digest.c_str(), c->ns.c_str(), c->snapshotter.c_str());
      if (c->runtime == ContainerRuntime::kDocker)
        std::printf("  image      %s (%s), name %s\n", c->image.c_str(), c->image_digest.c_str(),
                    c->name.c_str());
      if (c->layer == WritableLayer::kCarried)
        std::printf("  layer      its writable layer (rootfs-diff.tar)\n");
      else if (c->layer == WritableLayer::kNotCarried)
        std::printf("  layer      not carried (%s)\n", c->layer_why.c_str());
      else if (c->layer == WritableLayer::kRootfs)
        std::printf("  layer      its whole rootfs (rootfs.tar), for a host without it\n");
      // What a restore into another pod names with --join-ns.
      for (const auto& j : c->joins)
        std::printf("  joins      %s namespace %s%s\n", j.type.c_str(), j.path.c_str(),
                    j.movable ? "" : " (not moved by --join-ns)");
      for (const auto& [destination, source] : c->mounts)
        std::printf("  mount      %s from %s\n", destination.c_str(), source.c_str());
    }
    if (!info.extra.is_null()) {
      std::string extra = json_text(info.extra);
      if (extra.size() > 160) extra = extra.substr(0, 157) + "...";
      std::printf("extra        %s\n", extra.c_str());
    }
    std::printf("\n%-5s %-7s %12s %12s %7s  %s\n", "mode", "type", "size", "stored", "chunks",
                "path");
    for (const auto& f : info.files) {
      const bool file = f.type == EntryType::kFile;
      std::string path = f.path;
      if (f.type == EntryType::kSymlink) path += " -> " + f.target;
      if (f.type == EntryType::kDir) path += "/";
      std::printf("%-5s %-7s %12s %12s %7s  %s\n", format_mode(f.mode).c_str(),
                  entry_type_name(f.type), file ? human_bytes(f.size).c_str() : "-",
                  file ? human_bytes(f.compressed_size).c_str() : "-",
                  file ? std::to_string(f.chunks).c_str() : "-", path.c_str());
    }
  });
}

}  // namespace

void add_image_commands(CLI::App& app, Context& ctx) {
  add_pack(app, ctx);
  add_unpack(app, ctx);
  add_inspect(app, ctx);
  add_verify(app, ctx);
}

}  // namespace gpuckpt::cli
