// One HTTP request to a daemon on this host's unix socket: Docker's Engine API (HTTP/1.1 and
// JSON) and containerd's gRPC API (HTTP/2, whose status comes in the trailers). libcurl speaks
// both; this is only the part they share.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace gpuckpt::container {

struct HttpRequest {
  std::string method = "GET";
  std::string path;  // "/v1.41/containers/ID/json", "/containerd.services.tasks.v1.Tasks/Create"
  std::vector<std::string> headers;  // "Name: value"
  std::string body;
  bool http2 = false;  // prior knowledge: gRPC has no HTTP/1.1 upgrade
  std::chrono::seconds timeout{60};
  // Called once, from inside the transfer, when the request's head has gone out and its answer
  // has not come: the daemon works on it meanwhile. A request with a body may still be sending
  // it. For a fault point held while a daemon acts on a call.
  std::function<void()> on_sent;
};

struct HttpResponse {
  long status = 0;
  // Header and trailer fields, names in lower case; a trailer overwrites a header of its name.
  std::map<std::string, std::string> fields;
  std::string body;
};

// Throws Error(kProcess) naming `socket` when the daemon is not there or the transfer fails
// (timeout included); an HTTP error status is the caller's to judge.
HttpResponse http_on_socket(const std::filesystem::path& socket, const HttpRequest& r);

}  // namespace gpuckpt::container
