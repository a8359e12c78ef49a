#include "container/socket_http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <memory>

#include "gpuckpt/error.h"

namespace gpuckpt::container {

namespace {

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

// Daemons' answers here are small (a container's JSON, a protobuf message); anything far larger
// is not the answer asked for.
constexpr std::size_t kMaxBody = 64u << 20;

std::string trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

}  // namespace

HttpResponse http_on_socket(const std::filesystem::path& socket, const HttpRequest& r) {
  static const bool initialised = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  if (!initialised) throw Error(Errc::kInternal, "curl_global_init failed");
  std::unique_ptr<CURL, CurlDeleter> h(curl_easy_init());
  if (!h) throw Error(Errc::kInternal, "curl_easy_init failed");
  CURL* e = h.get();
  HttpResponse out;
  bool too_large = false;
  struct Ctx {
    HttpResponse* out;
    bool* too_large;
  } ctx{&out, &too_large};
  std::unique_ptr<curl_slist, SlistDeleter> headers;
  for (const auto& f : r.headers) {
    curl_slist* n = curl_slist_append(headers.get(), f.c_str());
    if (!n) throw Error(Errc::kInternal, "curl_slist_append failed");
    (void)headers.release();
    headers.reset(n);
  }
  const std::string url = "http://localhost" + r.path;
  curl_easy_setopt(e, CURLOPT_UNIX_SOCKET_PATH, socket.c_str());
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_TIMEOUT, static_cast<long>(r.timeout.count()));
  curl_easy_setopt(e, CURLOPT_HTTP_VERSION,
                   r.http2 ? CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE : CURL_HTTP_VERSION_1_1);
  curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r.method.c_str());
  if (r.method != "GET") {
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, r.body.data());
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(r.body.size()));
  }
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers.get());
  // libcurl reports the request's head as it hands it to the socket (CURLINFO_HEADER_OUT) only
  // to a debug callback, and calls that only when verbose.
  struct Sent {
    const std::function<void()>* fn;
    bool done = false;
  } sent{&r.on_sent};
  if (r.on_sent) {
    curl_easy_setopt(e, CURLOPT_VERBOSE, 1L);
    curl_easy_setopt(e, CURLOPT_DEBUGDATA, &sent);
    curl_easy_setopt(
        e, CURLOPT_DEBUGFUNCTION,
        +[](CURL*, curl_infotype type, char*, size_t, void* p) noexcept -> int {
          auto* s = static_cast<Sent*>(p);
          if (type != CURLINFO_HEADER_OUT || s->done) return 0;
          s->done = true;
          try {
            (*s->fn)();
          } catch (...) {
            // A fault point that throws has nothing to unwind here.
          }
          return 0;
        });
  }
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &ctx);
  curl_easy_setopt(
      e, CURLOPT_WRITEFUNCTION, +[](char* buf, size_t sz, size_t n, void* p) noexcept -> size_t {
        auto* c = static_cast<Ctx*>(p);
        const std::size_t len = sz * n;
        if (c->out->body.size() + len > kMaxBody) {
          *c->too_large = true;
          return 0;
        }
        try {
          c->out->body.append(buf, len);
        } catch (...) {
          return 0;
        }
        return len;
      });
  // Called for each header line and, with HTTP/2, for each trailer line too.
  curl_easy_setopt(e, CURLOPT_HEADERDATA, &ctx);
  curl_easy_setopt(
      e, CURLOPT_HEADERFUNCTION, +[](char* buf, size_t sz, size_t n, void* p) noexcept -> size_t {
        auto* c = static_cast<Ctx*>(p);
        try {
          const std::string_view line(buf, sz * n);
          if (line.starts_with("HTTP/")) {
            const auto sp = line.find(' ');
            c->out->status = sp == std::string_view::npos ? 0 : std::atol(line.data() + sp + 1);
          } else if (const auto colon = line.find(':'); colon != std::string_view::npos) {
            std::string name(line.substr(0, colon));
            std::transform(name.begin(), name.end(), name.begin(),
                           [](unsigned char ch) { return std::tolower(ch); });
            c->out->fields[name] = trim(line.substr(colon + 1));
          }
        } catch (...) {
          return 0;
        }
        return sz * n;
      });
  const CURLcode rc = curl_easy_perform(e);
  if (too_large)
    throw Error(Errc::kProcess, r.method + " " + r.path + " on " + socket.string() +
                                    ": the answer is larger than " + std::to_string(kMaxBody) +
                                    " bytes");
  if (rc != CURLE_OK)
    throw Error(Errc::kProcess,
                r.method + " " + r.path + " on " + socket.string() + ": " + curl_easy_strerror(rc) +
                    (rc == CURLE_COULDNT_CONNECT ? " (is the daemon running?)" : ""));
  return out;
}

}  // namespace gpuckpt::container
