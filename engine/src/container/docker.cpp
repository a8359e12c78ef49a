#include "container/docker.h"

#include <cctype>
#include <cstdlib>

#include "container/socket_http.h"
#include "gpuckpt/error.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gpuckpt::container::docker {

namespace {

// Docker 20.10's API version; later daemons serve it too.
constexpr const char* kApi = "/v1.41";

std::string url_encoded(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char ch : s) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
      out += static_cast<char>(ch);
    } else {
      out += '%';
      out += hex[ch >> 4];
      out += hex[ch & 15];
    }
  }
  return out;
}

}  // namespace

fs::path address() {
  if (const char* h = std::getenv("DOCKER_HOST"); h && *h) {
    const std::string s = h;
    if (s.rfind("unix://", 0) != 0)
      throw Error(Errc::kUsage, "DOCKER_HOST=" + s +
                                    ": gpuckpt reaches dockerd only on this host's unix socket "
                                    "(unix://PATH)");
    return s.substr(7);
  }
  return "/var/run/docker.sock";
}

Client::Client(fs::path socket) : socket_(std::move(socket)) {}

json Client::request(const std::string& method, const std::string& path, const json& body,
                     int* status, std::chrono::seconds timeout,
                     const std::function<void()>& on_sent) {
  HttpRequest r;
  r.method = method;
  r.path = kApi + path;
  r.timeout = timeout;
  r.on_sent = on_sent;
  if (!body.is_null()) {
    r.headers = {"Content-Type: application/json"};
    r.body = body.dump();
  }
  const HttpResponse a = http_on_socket(socket_, r);
  *status = static_cast<int>(a.status);
  json j = json::parse(a.body, nullptr, /*allow_exceptions=*/false);
  if (a.status >= 400 && a.status != 404)
    throw Error(a.status == 409 ? Errc::kExists : Errc::kProcess,
                "dockerd (" + socket_.string() + "): " + method + " " + path + ": " +
                    (string_at(j, {"message"}).empty() ? a.body : string_at(j, {"message"})));
  return j.is_discarded() ? json() : j;
}

namespace {

const json* at(const json& j, std::initializer_list<const char*> path) {
  const json* p = &j;
  for (const char* k : path) {
    if (!p->is_object()) return nullptr;
    const auto it = p->find(k);
    if (it == p->end()) return nullptr;
    p = &*it;
  }
  return p;
}

}  // namespace

std::string string_at(const json& j, std::initializer_list<const char*> path) {
  const json* p = at(j, path);
  return p && p->is_string() ? p->get<std::string>() : std::string();
}

bool flag_at(const json& j, std::initializer_list<const char*> path) {
  const json* p = at(j, path);
  return p && p->is_boolean() && p->get<bool>();
}

json object_at(const json& j, std::initializer_list<const char*> path) {
  const json* p = at(j, path);
  return p && p->is_object() ? *p : json::object();
}

std::optional<json> Client::inspect(const std::string& id, std::chrono::seconds timeout) {
  int st = 0;
  json j = request("GET", "/containers/" + url_encoded(id) + "/json", nullptr, &st, timeout);
  if (st == 404) return std::nullopt;
  return j;
}

std::optional<json> Client::image(const std::string& id) {
  int st = 0;
  json j = request("GET", "/images/" + url_encoded(id) + "/json", nullptr, &st,
                   std::chrono::seconds(30));
  if (st == 404) return std::nullopt;
  return j;
}

json Client::info() {
  int st = 0;
  return request("GET", "/info", nullptr, &st, std::chrono::seconds(30));
}

json Client::version() {
  int st = 0;
  return request("GET", "/version", nullptr, &st, std::chrono::seconds(30));
}

std::string Client::create(const std::string& name, const json& config, const json& host_config) {
  json body = config;
  body["HostConfig"] = host_config;
  // Its own hostname and MAC, as `docker run` would give it: the original's belong to it.
  body.erase("Hostname");
  body.erase("MacAddress");
  int st = 0;
  const json j = request("POST", "/containers/create?name=" + url_encoded(name), body, &st,
                         std::chrono::seconds(60));
  if (st == 404)
    throw Error(Errc::kInvalidInput, "dockerd cannot create container " + name + ": image " +
                                         string_at(config, {"Image"}) +
                                         " is not here (docker load or import it)");
  return string_at(j, {"Id"});
}

void Client::start_from_checkpoint(const std::string& id, const std::string& name,
                                   std::chrono::seconds timeout,
                                   const std::function<void()>& on_sent) {
  int st = 0;
  (void)request("POST", "/containers/" + url_encoded(id) + "/start?checkpoint=" + url_encoded(name),
                nullptr, &st, timeout, on_sent);
  if (st == 404) throw Error(Errc::kInvalidInput, "dockerd has no container " + id + " to start");
  // 304: it runs already, and was not restored from the images.
  if (st == 304)
    throw Error(Errc::kExists, "dockerd already runs container " + id + ": nothing was restored");
}

void Client::kill(const std::string& id) {
  int st = 0;
  try {
    (void)request("POST", "/containers/" + url_encoded(id) + "/kill", nullptr, &st,
                  std::chrono::seconds(60));
  } catch (const Error& e) {
    if (e.code() != Errc::kExists) throw;  // 409: it does not run
  }
}

void Client::remove(const std::string& id) {
  int st = 0;
  (void)request("DELETE", "/containers/" + url_encoded(id) + "?force=1", nullptr, &st,
                std::chrono::seconds(60));
}

}  // namespace gpuckpt::container::docker
