// The namespaces a container joined by path (a Kubernetes pod's, which its sandbox holds):
// reading them from its OCI spec, naming each as /proc shows it, and checking those that a
// restore joins (the pod's it was dumped in, or another's named by --join-ns).
#pragma once

#include <sys/types.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "container/record.h"
#include "gpuckpt/process.h"

namespace gpuckpt::container {

// The namespaces that `spec` joins by path (OCI type, path), in its order.
std::vector<std::pair<std::string, std::string>> joined_namespaces(const nlohmann::json& spec);

// An OCI namespace type's name under /proc/PID/ns ("network": "net").
std::string proc_ns_name(const std::string& type);

// The process or thread whose namespace a /proc/PID/ns/ or /proc/PID/task/TID/ns/ path names;
// 0 for another path (a bind mount, /proc/self).
pid_t ns_holder(const std::string& path);

// The path that `path` names through the links an operator made (a directory linked to /proc/PID,
// a link to /proc/PID/ns/ipc), up to the namespace file itself, whose own link is the kernel's.
std::string ns_file(const std::string& path);

// The network namespace that `r`'s container joined by path (a Kubernetes pod's, which its
// sandbox holds), as its OCI spec names it; "" for one of its own or the host's.
std::string joined_network(const ContainerRecord& r);

// Every namespace a restore of `r` joins by path, each refused (Error(kInvalidInput)) where it
// is not one of its type here: `joins`, else those recorded. A recorded /proc/PID/ns/ path must
// still name the namespace it named at the dump, held by the same process (a pod made again
// since gave the pid to another). Error(kUsage): `joins` for Docker's (dockerd makes its
// namespaces), or naming one the container did not join by path, or a relative path, or
// leaving out one it joined, or one it joined of a type gpuckpt cannot move (PodNamespace).
void check_joined_namespaces(const ContainerRecord& r, const PodNamespaces& joins);

// A copy restored under its runtime's record of the container dumped (containerd's, kept) is
// made from that record's spec, with the namespaces it names: `joins` is then Error(kUsage).
void require_new_record_for_joins(const ContainerRecord& r, const std::string& id,
                                  const PodNamespaces& joins);

// `--join-ns TYPE=PATH`, as restore and migrate take it (and as migrate passes it to a target).
std::vector<std::string> join_ns_args(const PodNamespaces& joins);

// Each namespace that `spec` joins by path becomes the one `joins` names for its type (runc
// then has CRIU join it: an external network namespace, --join-ns for ipc and uts).
void join_namespaces(nlohmann::json& spec, const PodNamespaces& joins);

}  // namespace gpuckpt::container
