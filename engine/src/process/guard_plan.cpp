#include "process/guard_plan.h"

#include <string>
#include <utility>

#include "gpuckpt/error.h"
#include "util/fs.h"

using nlohmann::json;

namespace fs = std::filesystem;

namespace gpuckpt::process {

namespace {

struct GuardOpName {
  GuardOp op;
  std::string_view name;
};
constexpr GuardOpName kGuardOps[] = {
    {GuardOp::kProtect, "protect"},
    {GuardOp::kCuda, "cuda"},
    {GuardOp::kCudaReport, "cuda_report"},
    {GuardOp::kCriu, "criu"},
    {GuardOp::kCriuExit, "criu_exit"},
    {GuardOp::kDurable, "durable"},
    {GuardOp::kCopy, "copy"},
    {GuardOp::kCopyPidfile, "copy_pidfile"},
    {GuardOp::kContainer, "container"},
    {GuardOp::kContainerRunc, "container_runc"},
    {GuardOp::kContainerInit, "container_init"},
    {GuardOp::kContainerId, "container_id"},
    {GuardOp::kContainerToken, "container_token"},
    {GuardOp::kCopyPath, "copy_path"},
    {GuardOp::kKeepCopy, "keep_copy"},
    {GuardOp::kHandOver, "hand_over"},
    {GuardOp::kRemove, "remove"},
    {GuardOp::kKeep, "keep"},
    {GuardOp::kRename, "rename"},
    {GuardOp::kRestoreFrom, "restore_from"},
    {GuardOp::kLocks, "locks"},
    {GuardOp::kAbort, "abort"},
    {GuardOp::kDone, "done"},
};

// At a commit: the entries moved aside (the replaced process's socket paths) are not put back,
// only removed.
void forget_renames(Plan& p) {
  for (const auto& [from, to] : p.renames) p.remove.push_back(from);
  p.renames.clear();
}

void apply_op(Plan& p, GuardOp op, const json& m, bool hold_dirs);

}  // namespace

std::string_view op_name(GuardOp op) {
  for (const auto& o : kGuardOps)
    if (o.op == op) return o.name;
  return "?";
}

GuardOp op_of(const json& m) {
  if (!m.is_object() || !m.contains("op") || !m["op"].is_string())
    throw Error(Errc::kCorrupt, "not a command: " + m.dump().substr(0, 200));
  const std::string name = m["op"].get<std::string>();
  for (const auto& o : kGuardOps)
    if (o.name == name) return o.op;
  throw Error(Errc::kCorrupt, "unknown command '" + name.substr(0, 64) + "'");
}

json command(GuardOp op, json fields) {
  fields["op"] = op_name(op);
  return fields;
}

void apply(Plan& p, const json& m, bool hold_dirs) {
  const GuardOp op = op_of(m);
  try {
    apply_op(p, op, m, hold_dirs);
  } catch (const json::exception& e) {
    throw Error(Errc::kCorrupt,
                "command '" + std::string(op_name(op)) + "' is malformed (" + e.what() + ")");
  }
}

namespace {

void apply_op(Plan& p, GuardOp op, const json& m, bool hold_dirs) {
  switch (op) {
    case GuardOp::kProtect: {
      p.roots.push_back(m.at("root").get<pid_t>());
      for (pid_t q : m.at("pids").get<std::vector<pid_t>>()) p.pids.insert(q);
      for (const auto& e : m.at("started"))
        p.started[e.at(0).get<pid_t>()] = e.at(1).get<std::uint64_t>();
      break;
    }
    case GuardOp::kCuda: {
      for (pid_t q : m.at("pids").get<std::vector<pid_t>>()) p.cuda.insert(q);
      break;
    }
    case GuardOp::kCudaReport: {
      p.cuda_report = m.at("path").get<std::string>();
      if (hold_dirs) {
        try {
          // The report lies in images/ of the dump's staging directory (make_images_dir).
          p.cuda_report_hold = hold_dir(p.cuda_report.parent_path().parent_path());
        } catch (const Error&) {
          // Gone already (the dump ended it, or a sweep took it): recovery then has p.cuda
          // alone.
        }
      }
      break;
    }
    case GuardOp::kCriu: {
      p.criu = m.at("pid").get<pid_t>();
      p.criu_started = m.at("started").get<std::uint64_t>();
      break;
    }
    case GuardOp::kDurable: {
      p.durable = true;
      p.end_targets = m.at("end").get<bool>();
      break;
    }
    case GuardOp::kCopy: {
      p.copies.push_back({m.at("pid").get<pid_t>(), m.at("pidns_init").get<pid_t>(),
                          m.at("pid_started").get<std::uint64_t>(),
                          m.at("init_started").get<std::uint64_t>(), m.at("kill").get<bool>()});
      break;
    }
    case GuardOp::kCopyPidfile: {
      p.copy_pidfiles.push_back({m.at("path").get<std::string>(),
                                 m.at("after").get<std::uint64_t>(), m.at("kill").get<bool>(),
                                 m.value("pids", std::vector<pid_t>{}),
                                 m.value("log", std::string())});
      break;
    }
    case GuardOp::kContainer: {
      p.containers.push_back({m.at("root").get<std::string>(), m.at("id").get<std::string>(),
                              m.at("after").get<std::uint64_t>(), m.at("kill").get<bool>(),
                              m.value("made", false)});
      break;
    }
    case GuardOp::kContainerRunc: {
      if (p.containers.empty()) throw Error(Errc::kCorrupt, "container_runc before container");
      p.containers.back().runc = m.at("pid").get<pid_t>();
      p.containers.back().runc_started = m.at("started").get<std::uint64_t>();
      break;
    }
    case GuardOp::kContainerInit: {
      if (p.containers.empty()) throw Error(Errc::kCorrupt, "container_init before container");
      p.containers.back().init_started = m.at("started").get<std::uint64_t>();
      break;
    }
    case GuardOp::kContainerId: {
      if (p.containers.empty()) throw Error(Errc::kCorrupt, "container_id before container");
      p.containers.back().id = m.at("id").get<std::string>();
      break;
    }
    case GuardOp::kContainerToken: {
      if (p.containers.empty()) throw Error(Errc::kCorrupt, "container_token before container");
      p.containers.back().unpacked_token = m.at("token").get<std::string>();
      break;
    }
    case GuardOp::kCriuExit: {
      if (!p.copy_pidfiles.empty()) {
        auto& n = p.copy_pidfiles.back();
        n.criu_clean = m.at("clean").get<bool>();
        if (auto log = m.value("log", std::string()); !log.empty()) n.log = std::move(log);
      }
      break;
    }
    case GuardOp::kCopyPath: {
      p.copy_paths.push_back({m.at("path").get<std::string>(), m.at("dev").get<std::uint64_t>(),
                              m.at("ino").get<std::uint64_t>(),
                              m.value("btime_ns", std::int64_t{0})});
      break;
    }
    case GuardOp::kKeepCopy: {
      p.copies.clear();
      p.copy_pidfiles.clear();
      p.containers.clear();
      p.copy_paths.clear();
      forget_renames(p);
      break;
    }
    case GuardOp::kRemove: {
      p.remove.emplace_back(m.at("path").get<std::string>());
      break;
    }
    case GuardOp::kKeep: {
      std::erase(p.remove, fs::path(m.at("path").get<std::string>()));
      break;
    }
    case GuardOp::kRename: {
      p.renames.emplace_back(m.at("from").get<std::string>(), m.at("to").get<std::string>());
      break;
    }
    case GuardOp::kRestoreFrom: {
      p.restore_from = m.at("checkpoint").get<std::string>();
      if (hold_dirs) {
        try {
          const fs::path dir = p.restore_from.parent_path();
          p.restore_hold = hold_dir(dir.empty() ? fs::path(".") : dir);
        } catch (const Error&) {
          // Not ours to hold (gone, or not a directory we may open): nobody sweeps it either.
        }
      }
      p.restore_staging = m.at("staging").get<std::string>();
      p.restore_criu = m.at("criu").get<std::string>();
      p.restore_container = m.value("container", std::string());
      break;
    }
    case GuardOp::kHandOver: {
      p.copies.clear();
      p.copy_pidfiles.clear();
      p.containers.clear();
      p.copy_paths.clear();
      forget_renames(p);
      p.restore_from.clear();
      p.restore_hold.reset();
      if (m.at("end").get<bool>()) {
        p.durable = p.end_targets = true;
      } else {
        // A release: the original ended already, and its pids now name the copy.
        p.roots.clear();
        p.pids.clear();
        p.cuda.clear();
        p.cuda_report.clear();
        p.cuda_report_hold.reset();
        p.started.clear();
      }
      break;
    }
    case GuardOp::kLocks:
    case GuardOp::kAbort:
    case GuardOp::kDone:
      // Control, not plan: the guard's loop acts on them (and a journal never holds them).
      break;
  }
}

}  // namespace

}  // namespace gpuckpt::process
