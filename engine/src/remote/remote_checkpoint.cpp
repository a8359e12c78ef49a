#include "remote/remote_checkpoint.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gpuckpt/error.h"
#include "image/manifest.h"
#include "util/fault.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;
using gpuckpt::image::kManifestName;
using gpuckpt::image::kSealName;

namespace gpuckpt::remote {

namespace {

constexpr std::uint64_t kMinPart = 5ull << 20;  // S3's minimum for every part but the last
constexpr unsigned kMaxParts = 10000;

unsigned resolve_connections(unsigned requested) {
  if (requested) return requested;
  if (const char* v = std::getenv("GPUCKPT_S3_CONNECTIONS")) {
    const long n = std::atol(v);
    if (n >= 1 && n <= 256) return static_cast<unsigned>(n);
  }
  return 8;
}

// Runs fn(0..n-1) on up to `threads` threads; the first error stops the others from taking
// more work and is rethrown here.
void parallel_for(std::size_t n, unsigned threads, const std::function<void(std::size_t)>& fn) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first;
  std::mutex mu;
  auto loop = [&] {
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i >= n || failed.load()) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
        failed = true;
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  const unsigned k = static_cast<unsigned>(std::min<std::size_t>(threads, n));
  for (unsigned t = 1; t < k; ++t) pool.emplace_back(loop);
  loop();
  for (auto& t : pool) t.join();
  if (first) std::rethrow_exception(first);
}

// Reports progress at most every 200 ms, from any thread.
class Meter {
 public:
  Meter(const ProgressFn& fn, std::string phase, std::uint64_t total)
      : fn_(fn), phase_(std::move(phase)), total_(total) {}
  void add(std::uint64_t n) {
    const std::uint64_t done = done_.fetch_add(n) + n;
    if (!fn_) return;
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    fn_({phase_, done, total_, std::chrono::duration<double>(now - start_).count()});
  }

 private:
  const ProgressFn& fn_;
  std::string phase_;
  std::uint64_t total_;
  std::atomic<std::uint64_t> done_{0};
  std::mutex mu_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_{};
};

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::uint64_t part_size(std::uint64_t size, std::uint64_t wanted) {
  std::uint64_t p = std::max(wanted, kMinPart);
  while ((size + p - 1) / p > kMaxParts) p *= 2;
  return p;
}

// The blob names of the checkpoint at `url`, if it has a readable manifest (for cleaning up
// after a replacement); empty otherwise.
std::set<std::string> remote_blob_names(const S3Client& s3, const S3Url& url) {
  std::set<std::string> names;
  try {
    const std::string text = s3.get(url.bucket, url.key(kManifestName), image::kMaxManifestBytes);
    for (const auto& b : image::parse_manifest(text, url.str()).blobs) names.insert(b.name);
  } catch (const Error&) {  // no manifest, or an unreadable one: nothing known to clean up
  }
  return names;
}

UniqueFd create_private(const fs::path& p) {
  UniqueFd fd(::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) throw_errno(Errc::kIo, "create ", p);
  return fd;
}

}  // namespace

void check_remote_output(const S3Client& s3, const S3Url& url, bool replace) {
  if (!replace && s3.head(url.bucket, url.key(kManifestName)))
    throw Error(Errc::kExists,
                url.str() + " already holds a checkpoint (use --force to replace it)");
}

TransferStats upload_checkpoint(const S3Client& s3, const fs::path& local, const S3Url& url,
                                bool replace, const TransferOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  TransferStats st;
  st.connections = resolve_connections(o.connections);

  // Every regular file but the manifest, which goes last.
  struct Object {
    std::string name;
    UniqueFd fd;
    std::uint64_t size = 0, part = 0;
    std::string upload_id;
    std::vector<std::string> etags;
  };
  std::vector<Object> objects;
  std::uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(local)) {
    const std::string name = e.path().filename().string();
    if (name == kManifestName || !e.is_regular_file() || e.is_symlink()) continue;
    Object ob;
    ob.name = name;
    ob.fd.reset(::open(e.path().c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!ob.fd) throw_errno(Errc::kIo, "open ", e.path());
    ob.size = fs::file_size(e.path());
    ob.part = part_size(ob.size, o.part_bytes);
    total += ob.size;
    objects.push_back(std::move(ob));
  }
  const fs::path manifest_path = local / kManifestName;
  const std::string manifest = read_file(manifest_path);
  total += manifest.size();

  std::set<std::string> old_blobs;
  if (replace) {
    old_blobs = remote_blob_names(s3, url);
    // Until the new manifest is in place the prefix holds no checkpoint at all, rather than
    // an old manifest over new blobs.
    s3.remove(url.bucket, url.key(kManifestName));
    ++st.requests;
  }

  // Large objects go up as multipart uploads: create them, then every part of every object
  // is one task for the connection pool.
  struct Task {
    std::size_t object;
    unsigned part;  // 0: a single PUT of the whole object
  };
  std::vector<Task> tasks;
  for (std::size_t i = 0; i < objects.size(); ++i) {
    Object& ob = objects[i];
    if (ob.size <= ob.part) {
      tasks.push_back({i, 0});
      continue;
    }
    const auto parts = static_cast<unsigned>((ob.size + ob.part - 1) / ob.part);
    ob.etags.resize(parts);
    for (unsigned p = 1; p <= parts; ++p) tasks.push_back({i, p});
  }
  auto abort_all = [&] {
    for (auto& ob : objects)
      if (!ob.upload_id.empty()) s3.abort_multipart(url.bucket, url.key(ob.name), ob.upload_id);
  };
  Meter meter(o.progress, "upload", total);
  std::atomic<std::uint64_t> requests{0};
  try {
    parallel_for(objects.size(), st.connections, [&](std::size_t i) {
      Object& ob = objects[i];
      if (!ob.etags.empty()) {
        ob.upload_id = s3.create_multipart(url.bucket, url.key(ob.name));
        ++requests;
      }
    });
    parallel_for(tasks.size(), st.connections, [&](std::size_t t) {
      Object& ob = objects[tasks[t].object];
      const std::string key = url.key(ob.name);
      if (tasks[t].part == 0) {
        s3.put_from_fd(url.bucket, key, ob.fd.get(), 0, ob.size);
        meter.add(ob.size);
      } else {
        const std::uint64_t off = (tasks[t].part - 1) * ob.part;
        const std::uint64_t len = std::min(ob.part, ob.size - off);
        ob.etags[tasks[t].part - 1] =
            s3.upload_part(url.bucket, key, ob.upload_id, tasks[t].part, ob.fd.get(), off, len);
        meter.add(len);
      }
      ++requests;
    });
    parallel_for(objects.size(), st.connections, [&](std::size_t i) {
      Object& ob = objects[i];
      if (ob.upload_id.empty()) return;
      s3.complete_multipart(url.bucket, url.key(ob.name), ob.upload_id, ob.etags);
      ob.upload_id.clear();
      ++requests;
    });
  } catch (...) {
    abort_all();
    rethrow_with_context("upload to " + url.str() + " failed: ",
                         "; no manifest was written there, so it holds no checkpoint");
  }
  // The manifest last: from this PUT on the checkpoint is complete and durable in the store.
  fault_point("upload_manifest");
  s3.put(url.bucket, url.key(kManifestName), manifest);
  meter.add(manifest.size());
  ++requests;

  std::set<std::string> kept;
  for (const auto& ob : objects) kept.insert(ob.name);
  for (const auto& name : old_blobs) {
    if (kept.count(name)) continue;
    try {
      s3.remove(url.bucket, url.key(name));
      ++requests;
    } catch (const Error& e) {
      spdlog::warn("could not remove {} of the replaced checkpoint: {}", url.key(name), e.what());
    }
  }
  st.bytes = total;
  st.objects = objects.size() + 1;
  st.requests = st.requests + requests.load();
  st.seconds = since(t0);
  return st;
}

TransferStats download_manifest(const S3Client& s3, const S3Url& url, const fs::path& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  TransferStats st;
  st.connections = 1;
  std::string manifest;
  try {
    manifest = s3.get(url.bucket, url.key(kManifestName), image::kMaxManifestBytes);
  } catch (const Error& e) {
    if (e.code() == Errc::kInvalidInput &&
        std::string_view(e.what()).find("HTTP 404") != std::string_view::npos)
      throw Error(Errc::kInvalidInput,
                  url.str() + " is not a gpuckpt checkpoint (no " + kManifestName + ")");
    throw;
  }
  st.bytes += manifest.size();
  std::optional<std::string> seal;
  if (s3.head(url.bucket, url.key(kSealName))) {
    seal = s3.get(url.bucket, url.key(kSealName), image::kMaxSealBytes);
    st.bytes += seal->size();
    ++st.objects;
  }
  auto write = [&](const char* name, const std::string& data) {
    const fs::path p = dir / name;
    UniqueFd fd = create_private(p);
    std::size_t off = 0;
    while (off < data.size()) {
      const ssize_t n = ::write(fd.get(), data.data() + off, data.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw_errno(Errc::kIo, "write ", p);
      off += static_cast<std::size_t>(n);
    }
  };
  write(kManifestName, manifest);
  if (seal) write(kSealName, *seal);
  st.objects += 1;
  st.requests = seal ? 3 : 2;
  st.seconds = since(t0);
  return st;
}

TransferStats download_checkpoint(const S3Client& s3, const S3Url& url, const fs::path& dir,
                                  const TransferOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  TransferStats st = download_manifest(s3, url, dir);
  st.connections = resolve_connections(o.connections);
  // The seal and the format are checked before a byte of the blobs is fetched.
  const image::Manifest m = image::load_manifest(dir);

  struct Range {
    std::size_t blob;
    std::uint64_t offset, len;
  };
  std::vector<UniqueFd> fds;
  std::vector<Range> ranges;
  std::uint64_t total = 0;
  const std::uint64_t step = std::max(o.part_bytes, kMinPart);
  for (std::size_t b = 0; b < m.blobs.size(); ++b) {
    const fs::path p = dir / m.blobs[b].name;
    fds.push_back(create_private(p));
    if (::ftruncate(fds.back().get(), static_cast<off_t>(m.blobs[b].size)) != 0)
      throw_errno(Errc::kIo, "size ", p);
    for (std::uint64_t off = 0; off < m.blobs[b].size; off += step)
      ranges.push_back({b, off, std::min(step, m.blobs[b].size - off)});
    total += m.blobs[b].size;
  }
  Meter meter(o.progress, "download", total);
  parallel_for(ranges.size(), st.connections, [&](std::size_t i) {
    const Range& r = ranges[i];
    s3.get_range_to_fd(url.bucket, url.key(m.blobs[r.blob].name), r.offset, r.len,
                       fds[r.blob].get(), r.offset);
    meter.add(r.len);
  });
  st.bytes += total;
  st.objects += m.blobs.size();
  st.requests += ranges.size();
  st.seconds = since(t0);
  return st;
}

fs::path spool_root(const fs::path& given) {
  if (!given.empty()) return given;
  const char* t = std::getenv("TMPDIR");
  return t && *t ? fs::path(t) : fs::path("/var/tmp");
}

TempDir make_spool(const fs::path& root, const std::string& prefix) {
  TempDir d(spool_root(root), prefix);
  if (::chmod(d.path().c_str(), 0700) != 0) throw_errno(Errc::kIo, "chmod ", d.path());
  return d;
}

LocalView::LocalView(const std::string& where, Fetch what, const fs::path& spool_root,
                     const TransferOptions& o) {
  if (!is_s3_url(where)) {
    path_ = where;
    return;
  }
  const S3Url url = parse_s3_url(where);
  const S3Client s3(S3Config::from_environment());
  spool_.emplace(make_spool(spool_root, "gpuckpt-fetch"));
  path_ = spool_->path();
  stats_ = what == Fetch::kManifest ? download_manifest(s3, url, path_)
                                    : download_checkpoint(s3, url, path_, o);
}

}  // namespace gpuckpt::remote
