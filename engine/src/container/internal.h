// Helpers that the container sources share (checkpoint.cpp's dump, restore.cpp's restore):
// not the container module's interface, which is checkpoint.h.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "container/containerd.h"
#include "container/docker.h"
#include "gpuckpt/error.h"
#include "util/mountinfo.h"
#include "util/unique_fd.h"

namespace gpuckpt::container {

// Runs `fn` on a thread of its own that has entered the network namespace of `pid`: setns
// changes only the calling thread's namespace, so gpuckpt's other threads stay where they are.
template <typename Fn>
auto in_network_of(pid_t pid, Fn fn) -> decltype(fn()) {
  const std::string ns = "/proc/" + std::to_string(pid) + "/ns/net";
  UniqueFd fd(::open(ns.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw_errno(Errc::kProcess, "open ", ns);
  decltype(fn()) result{};
  std::exception_ptr failure;
  std::thread t([&] {
    try {
      if (::setns(fd.get(), CLONE_NEWNET) != 0)
        throw_errno(Errc::kProcess, "entering the network namespace of pid ", pid);
      result = fn();
    } catch (...) {
      failure = std::current_exception();
    }
  });
  t.join();
  if (failure) std::rethrow_exception(failure);
  return result;
}

// The flags of the loopback device in the calling thread's network namespace.
short loopback_flags(int sock);

// A datagram socket for the interface ioctls. Throws Error(kProcess).
UniqueFd control_socket();

// /proc/PID/mountinfo as its process sees it (mount points relative to its root).
std::vector<MountInfo> mounts_of(pid_t pid);

// runc, or crun for Runtime::kCrun, with the root `root`: the start of every command line of a
// bare runtime.
std::vector<std::string> runtime_argv(Runtime runtime, const std::string& root);

// The bundle directory that a runtime's copy of a spec (state.json's "config") names in its
// labels (runc's last one); empty if none.
std::string bundle_of(const nlohmann::json& config);

// The overlay upper directory among a snapshot's mount options; empty if none.
std::filesystem::path upper_of(const std::vector<containerd::Mount>& mounts);

// What a dockerd must be to restore a checkpoint: what its runc gives CRIU closes TCP as the
// dump did, and it runs in experimental mode. Throws Error(kUsage) naming the fix.
void require_docker_restores(docker::Client& api);

// containerd's shim reaps an init that has ended, then its task shows stopped; a task can be
// deleted only then. Whether it is stopped (or gone) within `bound`.
bool task_stopped_within(containerd::Client& api, const std::string& id,
                         std::chrono::milliseconds bound);

}  // namespace gpuckpt::container
