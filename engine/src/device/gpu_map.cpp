#include "device/gpu_map.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include "device/cuda_driver.h"
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

}  // namespace gpuckpt
