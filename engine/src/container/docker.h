// Docker's Engine API, over dockerd's unix socket: what gpuckpt needs to dump a container that
// Docker runs, and to start it again from gpuckpt's images as the container Docker knows
// (`docker ps`). dockerd restores only from a checkpoint directory of its own
// (<DockerRootDir>/containers/ID/checkpoints/NAME: `--checkpoint-dir` is refused for start), so
// the images are put there for the start. docs/research/docker-containerd.md, 3.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace gpuckpt::container::docker {

// The string or flag at `path` in an answer of dockerd's: "" or false where it has none (a field
// missing, null, or of another type, as another version of dockerd may shape it), never a throw.
std::string string_at(const nlohmann::json& j, std::initializer_list<const char*> path);
bool flag_at(const nlohmann::json& j, std::initializer_list<const char*> path);
// The object at `path`; an empty one where there is none.
nlohmann::json object_at(const nlohmann::json& j, std::initializer_list<const char*> path);

// dockerd's socket: $DOCKER_HOST (unix:// only), else /var/run/docker.sock.
std::filesystem::path address();

class Client {
 public:
  explicit Client(std::filesystem::path socket = address());

  // GET /containers/ID/json (ID or name); nullopt if Docker has no such container. dockerd
  // answers only once a start of the container in flight has ended (it holds the container's
  // lock for the whole start, and so does its inspect).
  std::optional<nlohmann::json> inspect(const std::string& id,
                                        std::chrono::seconds timeout = std::chrono::seconds(30));
  // GET /images/ID/json; nullopt if dockerd has no such image.
  std::optional<nlohmann::json> image(const std::string& id);
  // GET /info, /version.
  nlohmann::json info();
  nlohmann::json version();
  // POST /containers/create?name=NAME with the inspected Config and HostConfig of another
  // container; returns the new container's ID.
  std::string create(const std::string& name, const nlohmann::json& config,
                     const nlohmann::json& host_config);
  // POST /containers/ID/start?checkpoint=NAME: dockerd's runc restores the images it finds in
  // its checkpoint directory NAME of that container.
  // `on_sent`, if given, runs once dockerd has the request and before its answer.
  void start_from_checkpoint(const std::string& id, const std::string& name,
                             std::chrono::seconds timeout,
                             const std::function<void()>& on_sent = {});
  // POST /containers/ID/kill (SIGKILL); a container that does not run is left as it is.
  void kill(const std::string& id);
  // DELETE /containers/ID?force=1.
  void remove(const std::string& id);

  const std::filesystem::path& socket() const { return socket_; }

 private:
  nlohmann::json request(const std::string& method, const std::string& path,
                         const nlohmann::json& body, int* status, std::chrono::seconds timeout,
                         const std::function<void()>& on_sent = {});
  std::filesystem::path socket_;
};

}  // namespace gpuckpt::container::docker
