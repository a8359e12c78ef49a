#include "container/containerd.h"

#include <arpa/inet.h>
#include <protobuf-c/protobuf-c.h>

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>

#include "container/socket_http.h"
#include "containerd_api.pb-c.h"
#include "gpuckpt/error.h"
#include "process/proc_info.h"
#include "util/fs.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;

namespace gpuckpt::container::containerd {

namespace {

// gRPC's status codes (grpc/include/grpc/impl/codegen/status.h) that change what gpuckpt does.
constexpr int kGrpcNotFound = 5;
constexpr int kGrpcAlreadyExists = 6;

constexpr const char* kRuncOptionsType = "containerd.runc.v1.Options";

std::string pack(const ProtobufCMessage* m) {
  std::string out(protobuf_c_message_get_packed_size(m), '\0');
  protobuf_c_message_pack(m, reinterpret_cast<std::uint8_t*>(out.data()));
  return out;
}

struct MessageFree {
  void operator()(void* m) const {
    protobuf_c_message_free_unpacked(static_cast<ProtobufCMessage*>(m), nullptr);
  }
};
template <class T>
using Unpacked = std::unique_ptr<T, MessageFree>;

template <class T>
Unpacked<T> unpack(const ProtobufCMessageDescriptor& d, const std::string& bytes,
                   const std::string& what) {
  auto* m = protobuf_c_message_unpack(&d, nullptr, bytes.size(),
                                      reinterpret_cast<const std::uint8_t*>(bytes.data()));
  if (!m) throw Error(Errc::kProcess, "containerd's answer to " + what + " is not its message");
  return Unpacked<T>(reinterpret_cast<T*>(m));
}

// protobuf-c takes char* for the strings it packs, and never writes through them.
char* str(const std::string& s) {
  return const_cast<char*>(s.c_str());
}
ProtobufCBinaryData bytes(const std::string& s) {
  return {s.size(), reinterpret_cast<std::uint8_t*>(const_cast<char*>(s.data()))};
}
std::string from(const ProtobufCBinaryData& b) {
  return b.data ? std::string(reinterpret_cast<const char*>(b.data), b.len) : std::string();
}
std::string from(const char* s) {
  return s ? std::string(s) : std::string();
}

// gRPC's message frame: no compression, a 4-byte big-endian length, the message.
std::string frame(const std::string& message) {
  std::string out(5, '\0');
  const std::uint32_t len = htonl(static_cast<std::uint32_t>(message.size()));
  std::memcpy(out.data() + 1, &len, 4);
  return out + message;
}

// grpc-message is percent-encoded (gRPC over HTTP/2, "Responses").
std::string percent_decoded(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      out += static_cast<char>(std::strtol(s.substr(i + 1, 2).c_str(), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::vector<Mount> mounts_from(Gpuckpt__Containerd__Mount** m, std::size_t n) {
  std::vector<Mount> out;
  for (std::size_t i = 0; i < n; ++i) {
    Mount x{from(m[i]->type), from(m[i]->source), from(m[i]->target), {}};
    for (std::size_t k = 0; k < m[i]->n_options; ++k) x.options.push_back(m[i]->options[k]);
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace

fs::path address() {
  if (const char* a = std::getenv("CONTAINERD_ADDRESS"); a && *a) {
    std::string s = a;
    if (s.rfind("unix://", 0) == 0) s = s.substr(7);
    return s;
  }
  return "/run/containerd/containerd.sock";
}

std::string restore_options(const std::string& base, const fs::path& criu, const fs::path& images,
                            const fs::path& work) {
  // Fields packed after `base` override its own (protobuf's merge of concatenated messages), and
  // every other option of the container's (its runc root, binary, systemd cgroups) stays.
  Gpuckpt__Containerd__RuncOptions o;
  gpuckpt__containerd__runc_options__init(&o);
  const std::string c = criu.string(), i = images.string(), w = work.string();
  o.criu_path = str(c);
  o.criu_image_path = str(i);
  o.criu_work_path = str(w);
  return base + pack(&o.base);
}

namespace {

// Where each running containerd makes its temporary directories, as Go's os.MkdirTemp does for
// it ($XDG_RUNTIME_DIR, else $TMPDIR, else /tmp), reached through its root, with the uid that
// owns what it makes.
std::vector<std::pair<fs::path, uid_t>> temp_dirs() {
  std::vector<std::pair<fs::path, uid_t>> out;
  for (const auto& p : process::live_procs_where(
           [](const process::ProcInfo& i) { return i.comm == "containerd"; })) {
    std::string d = process::environment_value(p.pid, "XDG_RUNTIME_DIR").value_or("");
    if (d.empty()) d = process::environment_value(p.pid, "TMPDIR").value_or("");
    if (d.empty()) d = "/tmp";
    const fs::path proc = "/proc/" + std::to_string(p.pid);
    struct stat st {};
    if (::stat(proc.c_str(), &st) != 0) continue;  // gone since
    fs::path at = proc / "root" / fs::path(d).relative_path();
    if (std::none_of(out.begin(), out.end(), [&](const auto& o) { return o.first == at; }))
      out.emplace_back(std::move(at), st.st_uid);
  }
  return out;
}

}  // namespace

std::string new_restore_token() {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < 4; ++i) {
    char w[9];
    std::snprintf(w, sizeof w, "%08x", static_cast<unsigned>(rd()));
    out += w;
  }
  return out;
}

std::string restore_token_in(const fs::path& dir) {
  const fs::path f = dir / kRestoreTokenFile;
  const UniqueFd fd(::open(f.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > 128) return {};
  try {
    return read_rest(fd.get(), f);
  } catch (const Error&) {
    return {};
  }
}

namespace {

// containerd's copies of a restore's images that hold `token`, each as seen through its
// containerd's /proc root.
std::vector<fs::path> unpacked_copies(const std::string& token) {
  std::vector<fs::path> out;
  if (token.empty()) return out;
  for (const auto& [dir, uid] : temp_dirs()) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      struct stat st {};
      if (e.path().filename().string().rfind("ctrd-checkpoint", 0) == 0 &&
          ::lstat(e.path().c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == uid &&
          restore_token_in(e.path()) == token)
        out.push_back(e.path());
    }
  }
  return out;
}

}  // namespace

bool take_from_unpacked_copy(const std::string& token, const std::string& name,
                             const fs::path& to) noexcept {
  try {
    for (const auto& copy : unpacked_copies(token)) {
      std::error_code ec;
      if (!fs::is_regular_file(fs::symlink_status(copy / name, ec))) continue;
      fs::copy_file(copy / name, to, fs::copy_options::overwrite_existing, ec);
      if (!ec) return true;
      spdlog::warn("cannot copy {} out of containerd's copy of the images: {}", name, ec.message());
    }
  } catch (const std::exception& e) {
    spdlog::warn("looking for {} in containerd's copies of the images: {}", name, e.what());
  }
  return false;
}

bool containerd_sees_as_here(const fs::path& dir) {
  struct stat here {};
  struct stat root {};
  if (::stat(dir.c_str(), &here) != 0 || ::stat("/", &root) != 0) return false;
  bool any = false;
  for (const auto& p : process::live_procs_where(
           [](const process::ProcInfo& i) { return i.comm == "containerd"; })) {
    const fs::path proc = "/proc/" + std::to_string(p.pid);
    // One in a root of its own (a node of kind, Docker in Docker) is no daemon of this host.
    struct stat its_root {};
    struct stat st {};
    if (::stat((proc / "root").c_str(), &its_root) != 0 || its_root.st_dev != root.st_dev ||
        its_root.st_ino != root.st_ino)
      continue;
    if (::stat((proc / "root" / dir.relative_path()).c_str(), &st) != 0 ||
        st.st_dev != here.st_dev || st.st_ino != here.st_ino)
      return false;
    any = true;
  }
  return any;
}

std::uint64_t remove_unpacked_copies(const std::string& token) noexcept {
  std::uint64_t removed = 0;
  if (token.empty()) return 0;
  try {
    for (const auto& copy : unpacked_copies(token)) {
      const std::uint64_t bytes = tree_bytes(copy);
      std::error_code rm;
      fs::remove_all(copy, rm);
      if (rm) {
        spdlog::warn("cannot remove containerd's copy of the images, {}: {}", copy.string(),
                     rm.message());
        continue;
      }
      spdlog::info("removed containerd's copy of the images, {} ({} KiB)", copy.string(),
                   bytes >> 10);
      removed += bytes;
    }
  } catch (const std::exception& e) {
    spdlog::warn("looking for containerd's copies of the images: {}", e.what());
  }
  return removed;
}

std::string options_root(const std::string& options) {
  if (options.empty()) return {};
  auto o = unpack<Gpuckpt__Containerd__RuncOptions>(gpuckpt__containerd__runc_options__descriptor,
                                                    options, "runc options");
  return from(o->root);
}

Client::Client(fs::path socket, std::string ns) : socket_(std::move(socket)), ns_(std::move(ns)) {}

std::optional<std::string> Client::call(const std::string& method, const std::string& request,
                                        bool missing_ok, std::chrono::seconds timeout) {
  HttpRequest r;
  r.method = "POST";
  r.path = "/containerd." + method;
  r.http2 = true;
  r.headers = {"Content-Type: application/grpc", "TE: trailers", "containerd-namespace: " + ns_};
  r.body = frame(request);
  r.timeout = timeout;
  const HttpResponse a = http_on_socket(socket_, r);
  const auto st = a.fields.find("grpc-status");
  if (a.status != 200 || st == a.fields.end())
    throw Error(Errc::kProcess, "containerd (" + socket_.string() + ") answered " + method +
                                    " with HTTP " + std::to_string(a.status) +
                                    " and no gRPC status: is that socket containerd's?");
  const int code = std::atoi(st->second.c_str());
  if (code != 0) {
    const auto msg = a.fields.find("grpc-message");
    const std::string why = msg == a.fields.end() ? "" : percent_decoded(msg->second);
    if (code == kGrpcNotFound && missing_ok) return std::nullopt;
    throw Error(code == kGrpcAlreadyExists ? Errc::kExists : Errc::kProcess,
                "containerd " + method + " (namespace " + ns_ + "): " + why);
  }
  if (a.body.size() < 5) return std::string();
  std::uint32_t len = 0;
  std::memcpy(&len, a.body.data() + 1, 4);
  len = ntohl(len);
  if (a.body[0] != 0 || a.body.size() != 5 + std::size_t{len})
    throw Error(Errc::kProcess, "containerd's answer to " + method + " is not one gRPC message");
  return a.body.substr(5);
}

std::string Client::version() {
  const auto a = call("services.version.v1.Version/Version", "");
  auto v = unpack<Gpuckpt__Containerd__VersionResponse>(
      gpuckpt__containerd__version_response__descriptor, *a, "Version");
  return from(v->version);
}

std::optional<ContainerInfo> Client::container(const std::string& id) {
  Gpuckpt__Containerd__GetContainerRequest q;
  gpuckpt__containerd__get_container_request__init(&q);
  q.id = str(id);
  const auto a = call("services.containers.v1.Containers/Get", pack(&q.base), true);
  if (!a) return std::nullopt;
  auto r = unpack<Gpuckpt__Containerd__GetContainerResponse>(
      gpuckpt__containerd__get_container_response__descriptor, *a, "Containers.Get");
  const auto* c = r->container;
  if (!c) return std::nullopt;
  ContainerInfo out;
  out.id = from(c->id);
  for (std::size_t i = 0; i < c->n_labels; ++i)
    out.labels[from(c->labels[i]->key)] = from(c->labels[i]->value);
  out.image = from(c->image);
  if (c->runtime) {
    out.runtime = from(c->runtime->name);
    if (c->runtime->options) {
      out.runtime_options_type = from(c->runtime->options->type_url);
      out.runtime_options = from(c->runtime->options->value);
    }
  }
  if (c->spec) out.spec = from(c->spec->value);
  out.snapshotter = from(c->snapshotter);
  out.snapshot_key = from(c->snapshot_key);
  out.sandbox = from(c->sandbox);
  return out;
}

void Client::create_container(const ContainerInfo& in) {
  Gpuckpt__Containerd__Container c;
  gpuckpt__containerd__container__init(&c);
  c.id = str(in.id);
  std::vector<Gpuckpt__Containerd__Container__LabelsEntry> entries(in.labels.size());
  std::vector<Gpuckpt__Containerd__Container__LabelsEntry*> labels;
  std::size_t i = 0;
  for (const auto& [k, v] : in.labels) {
    gpuckpt__containerd__container__labels_entry__init(&entries[i]);
    entries[i].key = str(k);
    entries[i].value = str(v);
    labels.push_back(&entries[i++]);
  }
  c.n_labels = labels.size();
  c.labels = labels.data();
  c.image = str(in.image);
  Gpuckpt__Containerd__Container__Runtime rt;
  gpuckpt__containerd__container__runtime__init(&rt);
  rt.name = str(in.runtime);
  Gpuckpt__Containerd__Any opts;
  gpuckpt__containerd__any__init(&opts);
  if (!in.runtime_options_type.empty()) {
    opts.type_url = str(in.runtime_options_type);
    opts.value = bytes(in.runtime_options);
    rt.options = &opts;
  }
  c.runtime = &rt;
  Gpuckpt__Containerd__Any spec;
  gpuckpt__containerd__any__init(&spec);
  const std::string spec_type = "types.containerd.io/opencontainers/runtime-spec/1/Spec";
  spec.type_url = str(spec_type);
  spec.value = bytes(in.spec);
  c.spec = &spec;
  c.snapshotter = str(in.snapshotter);
  c.snapshot_key = str(in.snapshot_key);
  c.sandbox = str(in.sandbox);
  Gpuckpt__Containerd__CreateContainerRequest q;
  gpuckpt__containerd__create_container_request__init(&q);
  q.container = &c;
  (void)call("services.containers.v1.Containers/Create", pack(&q.base));
}

void Client::delete_container(const std::string& id) {
  Gpuckpt__Containerd__DeleteContainerRequest q;
  gpuckpt__containerd__delete_container_request__init(&q);
  q.id = str(id);
  (void)call("services.containers.v1.Containers/Delete", pack(&q.base), true);
}

std::optional<std::string> Client::image_digest(const std::string& name) {
  Gpuckpt__Containerd__GetImageRequest q;
  gpuckpt__containerd__get_image_request__init(&q);
  q.name = str(name);
  const auto a = call("services.images.v1.Images/Get", pack(&q.base), true);
  if (!a) return std::nullopt;
  auto r = unpack<Gpuckpt__Containerd__GetImageResponse>(
      gpuckpt__containerd__get_image_response__descriptor, *a, "Images.Get");
  if (!r->image || !r->image->target) return std::nullopt;
  return from(r->image->target->digest);
}

std::vector<Mount> Client::snapshot_mounts(const std::string& snapshotter, const std::string& key) {
  Gpuckpt__Containerd__MountsRequest q;
  gpuckpt__containerd__mounts_request__init(&q);
  q.snapshotter = str(snapshotter);
  q.key = str(key);
  const auto a = call("services.snapshots.v1.Snapshots/Mounts", pack(&q.base));
  auto r = unpack<Gpuckpt__Containerd__MountsResponse>(
      gpuckpt__containerd__mounts_response__descriptor, *a, "Snapshots.Mounts");
  return mounts_from(r->mounts, r->n_mounts);
}

std::optional<std::string> Client::snapshot_parent(const std::string& snapshotter,
                                                   const std::string& key) {
  Gpuckpt__Containerd__StatSnapshotRequest q;
  gpuckpt__containerd__stat_snapshot_request__init(&q);
  q.snapshotter = str(snapshotter);
  q.key = str(key);
  const auto a = call("services.snapshots.v1.Snapshots/Stat", pack(&q.base), true);
  if (!a) return std::nullopt;
  auto r = unpack<Gpuckpt__Containerd__StatSnapshotResponse>(
      gpuckpt__containerd__stat_snapshot_response__descriptor, *a, "Snapshots.Stat");
  return r->info ? from(r->info->parent) : std::string();
}

std::vector<Mount> Client::prepare_snapshot(const std::string& snapshotter, const std::string& key,
                                            const std::string& parent) {
  Gpuckpt__Containerd__PrepareSnapshotRequest q;
  gpuckpt__containerd__prepare_snapshot_request__init(&q);
  q.snapshotter = str(snapshotter);
  q.key = str(key);
  q.parent = str(parent);
  const auto a = call("services.snapshots.v1.Snapshots/Prepare", pack(&q.base));
  auto r = unpack<Gpuckpt__Containerd__PrepareSnapshotResponse>(
      gpuckpt__containerd__prepare_snapshot_response__descriptor, *a, "Snapshots.Prepare");
  return mounts_from(r->mounts, r->n_mounts);
}

void Client::remove_snapshot(const std::string& snapshotter, const std::string& key) {
  Gpuckpt__Containerd__RemoveSnapshotRequest q;
  gpuckpt__containerd__remove_snapshot_request__init(&q);
  q.snapshotter = str(snapshotter);
  q.key = str(key);
  (void)call("services.snapshots.v1.Snapshots/Remove", pack(&q.base), true);
}

std::optional<TaskState> Client::task(const std::string& container_id) {
  Gpuckpt__Containerd__GetTaskRequest q;
  gpuckpt__containerd__get_task_request__init(&q);
  q.container_id = str(container_id);
  const auto a = call("services.tasks.v1.Tasks/Get", pack(&q.base), true);
  if (!a) return std::nullopt;
  auto r = unpack<Gpuckpt__Containerd__GetTaskResponse>(
      gpuckpt__containerd__get_task_response__descriptor, *a, "Tasks.Get");
  if (!r->process) return std::nullopt;
  TaskState t;
  t.pid = static_cast<pid_t>(r->process->pid);
  switch (r->process->status) {
    case GPUCKPT__CONTAINERD__TASK_STATUS__CREATED:
      t.status = TaskStatus::kCreated;
      break;
    case GPUCKPT__CONTAINERD__TASK_STATUS__RUNNING:
      t.status = TaskStatus::kRunning;
      break;
    case GPUCKPT__CONTAINERD__TASK_STATUS__STOPPED:
      t.status = TaskStatus::kStopped;
      break;
    case GPUCKPT__CONTAINERD__TASK_STATUS__PAUSED:
      t.status = TaskStatus::kPaused;
      break;
    case GPUCKPT__CONTAINERD__TASK_STATUS__PAUSING:
      t.status = TaskStatus::kPausing;
      break;
    default:
      break;
  }
  return t;
}

pid_t Client::create_task(const CreateTask& t) {
  Gpuckpt__Containerd__CreateTaskRequest q;
  gpuckpt__containerd__create_task_request__init(&q);
  q.container_id = str(t.container_id);
  std::vector<Gpuckpt__Containerd__Mount> ms(t.rootfs.size());
  std::vector<Gpuckpt__Containerd__Mount*> mp;
  std::vector<std::vector<char*>> opts(t.rootfs.size());
  for (std::size_t i = 0; i < t.rootfs.size(); ++i) {
    gpuckpt__containerd__mount__init(&ms[i]);
    ms[i].type = str(t.rootfs[i].type);
    ms[i].source = str(t.rootfs[i].source);
    ms[i].target = str(t.rootfs[i].target);
    for (const auto& o : t.rootfs[i].options) opts[i].push_back(str(o));
    ms[i].n_options = opts[i].size();
    ms[i].options = opts[i].data();
    mp.push_back(&ms[i]);
  }
  q.n_rootfs = mp.size();
  q.rootfs = mp.data();
  q.stdin = str(t.stdin_fifo);
  q.stdout = str(t.stdout_uri);
  q.stderr = str(t.stderr_uri);
  Gpuckpt__Containerd__Any o;
  gpuckpt__containerd__any__init(&o);
  const std::string type = t.options_type.empty() ? kRuncOptionsType : t.options_type;
  o.type_url = str(type);
  o.value = bytes(t.options);
  q.options = &o;
  const auto a = call("services.tasks.v1.Tasks/Create", pack(&q.base), false, t.timeout);
  auto r = unpack<Gpuckpt__Containerd__CreateTaskResponse>(
      gpuckpt__containerd__create_task_response__descriptor, *a, "Tasks.Create");
  return static_cast<pid_t>(r->pid);
}

void Client::start_task(const std::string& container_id, std::chrono::seconds timeout) {
  Gpuckpt__Containerd__StartRequest q;
  gpuckpt__containerd__start_request__init(&q);
  q.container_id = str(container_id);
  (void)call("services.tasks.v1.Tasks/Start", pack(&q.base), false, timeout);
}

void Client::kill_task(const std::string& container_id, int signal) {
  Gpuckpt__Containerd__KillRequest q;
  gpuckpt__containerd__kill_request__init(&q);
  q.container_id = str(container_id);
  q.signal = static_cast<std::uint32_t>(signal);
  q.all = true;
  (void)call("services.tasks.v1.Tasks/Kill", pack(&q.base), true);
}

void Client::delete_task(const std::string& container_id) {
  Gpuckpt__Containerd__DeleteTaskRequest q;
  gpuckpt__containerd__delete_task_request__init(&q);
  q.container_id = str(container_id);
  (void)call("services.tasks.v1.Tasks/Delete", pack(&q.base), true);
}

}  // namespace gpuckpt::container::containerd
