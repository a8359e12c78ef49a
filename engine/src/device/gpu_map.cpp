#include "device/gpu_map.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "device/cuda_checkpoint.h"
#include "device/cuda_driver.h"
#include "device/nvml.h"
#include "gpuckpt/error.h"

namespace gpuckpt::device {

namespace {

const char* kSyntax = "expected OLD=NEW[,OLD=NEW...] with GPU UUIDs or device indices";

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 6 &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

const GpuInfo* find_uuid(const std::vector<GpuInfo>& gpus, const std::string& uuid) {
  for (const auto& g : gpus)
    if (g.uuid == uuid) return &g;
  return nullptr;
}

}  // namespace

bool same_chip_type(const GpuInfo& a, const GpuInfo& b) {
  return a.name == b.name && a.compute_major == b.compute_major &&
         a.compute_minor == b.compute_minor;
}

std::string describe_gpu(const GpuInfo& g) {
  return "GPU " + std::to_string(g.index) + " (" + g.name + ", sm_" +
         std::to_string(g.compute_major) + std::to_string(g.compute_minor) + ", " + g.uuid + ")";
}

GpuMap parse_gpu_map(const std::string& spec, const std::function<DeviceList()>& local_fn) {
  std::optional<DeviceList> local;
  auto devices = [&]() -> const DeviceList& {
    if (!local) local = local_fn();
    return *local;
  };

  // One side of a pair: a UUID (normalised to lower case) or an index of this machine.
  auto resolve = [&](const std::string& side, const std::string& item) -> std::string {
    if (side.empty()) throw Error(Errc::kUsage, "bad --gpu-map entry '" + item + "': " + kSyntax);
    if (all_digits(side)) {
      const DeviceList& d = devices();
      if (!d.driver.loaded)
        throw Error(Errc::kUsage, "cannot resolve GPU index " + side + " in --gpu-map '" + item +
                                      "': no NVIDIA GPU: " + d.driver.error +
                                      " (give GPU UUIDs instead)");
      const long idx = std::stol(side);
      if (idx >= static_cast<long>(d.gpus.size()))
        throw Error(Errc::kUsage, "GPU index " + side + " in --gpu-map '" + item +
                                      "' is out of range: this machine has " +
                                      std::to_string(d.gpus.size()) + " GPU(s)");
      return d.gpus[static_cast<size_t>(idx)].uuid;
    }
    if (side.size() >= 4 && (side.compare(0, 4, "MIG-") == 0 || side.compare(0, 4, "mig-") == 0))
      throw Error(Errc::kUsage,
                  "MIG instance '" + side + "' in --gpu-map: only whole GPUs can be remapped");
    unsigned char bytes[16];
    if (!parse_gpu_uuid(side, bytes))
      throw Error(Errc::kUsage,
                  "'" + side + "' in --gpu-map '" + item +
                      "' is neither a GPU UUID "
                      "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) nor a device index");
    return format_gpu_uuid(bytes);
  };

  GpuMap map;
  const std::string s = trim(spec);
  if (s.empty()) return map;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string item =
        trim(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    const size_t eq = item.find('=');
    if (item.empty() || eq == std::string::npos || item.find('=', eq + 1) != std::string::npos)
      throw Error(Errc::kUsage, "bad --gpu-map entry '" + item + "': " + kSyntax);
    const std::string from = resolve(trim(item.substr(0, eq)), item);
    const std::string to = resolve(trim(item.substr(eq + 1)), item);
    for (const auto& [f, t] : map.pairs) {
      if (f == from) throw Error(Errc::kUsage, "--gpu-map names source GPU " + from + " twice");
      if (t == to) throw Error(Errc::kUsage, "--gpu-map maps two GPUs onto " + to);
    }
    map.pairs.emplace_back(from, to);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }

  // Pairs of two GPUs of this machine can be checked now; pairs with a GPU of another machine
  // are checked against the checkpoint's record by validate_gpu_map().
  const DeviceList& d = devices();
  for (const auto& [from, to] : map.pairs) {
    const GpuInfo* a = find_uuid(d.gpus, from);
    const GpuInfo* b = find_uuid(d.gpus, to);
    if (a && b && !same_chip_type(*a, *b))
      throw Error(Errc::kUsage, "cannot remap " + describe_gpu(*a) + " onto " + describe_gpu(*b) +
                                    ": CUDA restores only onto a GPU of the same chip type");
  }
  return map;
}

void validate_gpu_map(const GpuMap& map, const std::vector<GpuInfo>& checkpointed,
                      const std::vector<GpuInfo>& local) {
  for (const auto& [from, to] : map.pairs) {
    const GpuInfo* src = find_uuid(checkpointed, from);
    if (!src) {
      std::string known;
      for (const auto& g : checkpointed) known += (known.empty() ? "" : ", ") + g.uuid;
      throw Error(Errc::kUsage, "--gpu-map source " + from +
                                    " is not a GPU of the checkpoint (it has: " +
                                    (known.empty() ? std::string("none recorded") : known) + ")");
    }
    const GpuInfo* dst = find_uuid(local, to);
    if (!dst) throw Error(Errc::kUsage, "--gpu-map target " + to + " is not a GPU of this machine");
    if (!same_chip_type(*src, *dst))
      throw Error(Errc::kUsage, "cannot remap " + describe_gpu(*src) + " onto " +
                                    describe_gpu(*dst) +
                                    ": CUDA restores only onto a GPU of the same chip type");
  }
}

void check_restore_targets(const std::vector<RecordedGpu>& recorded, const GpuMap& map,
                           const std::vector<LocalGpu>& local) {
  // Sources of the map must be GPUs of the checkpoint; every checkpointed GPU needs a target.
  std::vector<GpuInfo> checkpointed;
  // UUIDs compare in lower case (gpuckpt's normal form; /proc and NVML may differ).
  auto lower = [](std::string u) {
    for (auto& c : u) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return u;
  };
  for (const auto& r : recorded) {
    GpuInfo g;
    g.index = static_cast<int>(checkpointed.size());
    g.uuid = lower(r.uuid);
    g.name = r.name;
    g.compute_major = r.compute_major;
    g.compute_minor = r.compute_minor;
    checkpointed.push_back(g);
  }
  std::vector<LocalGpu> here_gpus = local;
  std::vector<GpuInfo> here;
  for (auto& l : here_gpus) {
    l.info.uuid = lower(l.info.uuid);
    here.push_back(l.info);
  }
  // The map's own rules (validate_gpu_map), when both sides are described: records of older
  // dumps have UUIDs only, and are checked below as far as they can be.
  const auto named = [](const auto& g) { return !g.name.empty(); };
  if (std::all_of(checkpointed.begin(), checkpointed.end(), named) &&
      std::all_of(here.begin(), here.end(), named)) {
    GpuMap lowered;
    for (const auto& [from, to] : map.pairs) lowered.pairs.emplace_back(lower(from), lower(to));
    validate_gpu_map(lowered, checkpointed, here);
  }
  auto target_of = [&](const std::string& uuid) -> std::string {
    if (map.empty()) return uuid;
    for (const auto& [from, to] : map.pairs)
      if (lower(from) == uuid) return lower(to);
    return {};
  };
  for (const auto& [from, to] : map.pairs) {
    if (!find_uuid(checkpointed, lower(from))) {
      std::string known;
      for (const auto& g : checkpointed) known += (known.empty() ? "" : ", ") + g.uuid;
      throw Error(Errc::kUsage, "--gpu-map source " + from +
                                    " is not a GPU of the checkpoint (it has: " +
                                    (known.empty() ? std::string("none recorded") : known) + ")");
    }
  }
  // Memory needed per target GPU (summed, so that the check holds for any map).
  std::vector<std::pair<std::string, std::uint64_t>> need;
  for (size_t i = 0; i < recorded.size(); ++i) {
    const RecordedGpu& r = recorded[i];
    const std::string to = target_of(checkpointed[i].uuid);
    if (to.empty())
      throw Error(Errc::kUsage, "the checkpointed process used GPU " + r.uuid +
                                    ", which the GPU map does not map (map every GPU it used)");
    const LocalGpu* dst = nullptr;
    for (const auto& l : here_gpus)
      if (l.info.uuid == to) dst = &l;
    if (!dst)
      throw Error(Errc::kUsage,
                  map.empty() ? "the checkpointed process used GPU " + r.uuid +
                                    ", which this machine does not have: restore onto one of its "
                                    "GPUs with --gpu-map " +
                                    r.uuid + "=UUID"
                              : "--gpu-map target " + to + " is not a GPU of this machine");
    // Records of older dumps (or dumps without NVML) have no name: nothing to compare.
    if (!r.name.empty() && !dst->info.name.empty() && !same_chip_type(checkpointed[i], dst->info))
      throw Error(Errc::kUsage, "cannot restore " + describe_gpu(checkpointed[i]) + " onto " +
                                    describe_gpu(dst->info) +
                                    ": CUDA restores only onto a GPU of the same chip type");
    auto it = std::find_if(need.begin(), need.end(), [&](const auto& n) { return n.first == to; });
    if (it == need.end())
      need.emplace_back(to, r.process_memory);
    else
      it->second += r.process_memory;
  }
  for (const auto& [uuid, bytes] : need) {
    const LocalGpu* dst = nullptr;
    for (const auto& l : here_gpus)
      if (l.info.uuid == uuid) dst = &l;
    if (!dst || !dst->free_memory || bytes == 0) continue;  // unknown: the driver will tell
    if (*dst->free_memory < bytes)
      throw Error(Errc::kDevice,
                  describe_gpu(dst->info) + " has " + std::to_string(*dst->free_memory >> 20) +
                      " MiB free, but the checkpoint needs " + std::to_string(bytes >> 20) +
                      " MiB there: nothing was restored (a CUDA restore that runs out of GPU "
                      "memory can leave the process checkpointed for good); free GPU memory or "
                      "restore onto another GPU with --gpu-map");
  }
}

}  // namespace gpuckpt::device

namespace gpuckpt {

std::string GpuMap::to_string() const {
  std::string s;
  for (const auto& [from, to] : pairs) s += (s.empty() ? "" : ",") + from + "=" + to;
  return s;
}

GpuMap parse_gpu_map(const std::string& spec) {
  return device::parse_gpu_map(spec, [] { return list_devices(); });
}

void validate_gpu_map(const GpuMap& map, const std::vector<GpuInfo>& checkpointed_gpus) {
  if (map.empty()) return;
  device::validate_gpu_map(map, checkpointed_gpus, list_devices().gpus);
}

std::vector<RecordedGpu> describe_checkpointed_gpus(const std::vector<std::string>& uuids,
                                                    const std::vector<pid_t>& pids) {
  std::vector<RecordedGpu> out;
  if (uuids.empty()) return out;
  const auto gpus = device::nvml_gpus();
  const auto mem = device::nvml_process_memory(pids);
  for (const auto& u : uuids) {
    RecordedGpu r;
    r.uuid = u;
    for (const auto& g : gpus)
      if (g.uuid == u) {
        r.name = g.name;
        r.compute_major = g.compute_major;
        r.compute_minor = g.compute_minor;
        r.total_memory = g.memory.total;
      }
    if (mem)
      if (auto it = mem->find(u); it != mem->end()) r.process_memory = it->second;
    out.push_back(std::move(r));
  }
  return out;
}

std::uint64_t gpu_memory_of(const std::vector<pid_t>& pids) {
  // Only processes that hold a GPU: NVML is not even loaded for the usual CPU-only dump.
  bool any = false;
  for (pid_t p : pids) any |= device::holds_device_files(p);
  if (!any) return 0;
  const auto mem = device::nvml_process_memory(pids);
  std::uint64_t sum = 0;
  if (mem)
    for (const auto& [uuid, bytes] : *mem) sum += bytes;
  return sum;
}

void check_restore_targets(const std::vector<RecordedGpu>& recorded, const GpuMap& map) {
  if (recorded.empty()) return;
  std::vector<device::LocalGpu> local;
  for (const auto& g : device::nvml_gpus()) {
    device::LocalGpu l;
    l.info.index = static_cast<int>(local.size());
    l.info.uuid = g.uuid;
    l.info.name = g.name;
    l.info.compute_major = g.compute_major;
    l.info.compute_minor = g.compute_minor;
    l.info.total_memory = g.memory.total;
    if (g.memory.total) l.free_memory = g.memory.free;
    local.push_back(std::move(l));
  }
  if (local.empty())  // no NVML: the driver (costs a cuInit here, a fallback only)
    for (const auto& g : list_devices().gpus) local.push_back({g, std::nullopt});
  device::check_restore_targets(recorded, map, local);
}

}  // namespace gpuckpt
