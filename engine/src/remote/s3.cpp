#include "remote/s3.h"

#include <curl/curl.h>
#include <unistd.h>

#include <strings.h>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "gpuckpt/error.h"
#include "util/write_fully.h"

namespace gpuckpt::remote {

namespace {

constexpr int kAttempts = 4;

bool valid_bucket(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b)
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.'))
      return false;
  return b.front() != '-' && b.front() != '.' && b.back() != '-' && b.back() != '.';
}

std::string env_or(const char* name, const std::string& fallback = {}) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// The sections of an AWS INI file ("[default]", "[profile x]" in config, "[x]" in
// credentials), as key -> value per section name. A missing file is empty.
std::map<std::string, std::map<std::string, std::string>> read_ini(const std::string& path) {
  std::map<std::string, std::map<std::string, std::string>> out;
  std::ifstream in(path);
  std::string line, section;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = trim(line.substr(1, line.size() - 2));
      continue;
    }
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    out[section][trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return out;
}

std::string home_file(const char* env, const char* rel) {
  if (const std::string p = env_or(env); !p.empty()) return p;
  return env_or("HOME", "/root") + "/" + rel;
}

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
      throw Error(Errc::kInternal, "curl_global_init failed");
  });
}

// Unreserved characters stay, '/' stays in keys, everything else is %XX (RFC 3986, as SigV4's
// canonical URI wants it).
std::string uri_encode(std::string_view s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// XML's five predefined entities and numeric references, as S3 escapes keys in a listing.
std::string xml_unescape(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    const auto semi = s.find(';', i);
    if (semi == std::string_view::npos) {
      out += s.substr(i);
      break;
    }
    const std::string_view ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp")
      out += '&';
    else if (ent == "lt")
      out += '<';
    else if (ent == "gt")
      out += '>';
    else if (ent == "quot")
      out += '"';
    else if (ent == "apos")
      out += '\'';
    else if (ent.starts_with("#x") || ent.starts_with("#X"))
      out += static_cast<char>(std::strtol(std::string(ent.substr(2)).c_str(), nullptr, 16));
    else if (ent.starts_with("#"))
      out += static_cast<char>(std::strtol(std::string(ent.substr(1)).c_str(), nullptr, 10));
    else
      out += s.substr(i, semi - i + 1);
    i = semi;
  }
  return out;
}

// The text of the first <tag>...</tag> in an XML answer ("" if none): S3's answers are small
// and flat, and we read only UploadId, Code and Message from them.
std::string xml_value(const std::string& xml, const std::string& tag) {
  const auto b = xml.find("<" + tag + ">");
  if (b == std::string::npos) return {};
  const auto start = b + tag.size() + 2;
  const auto e = xml.find("</" + tag + ">", start);
  return e == std::string::npos ? std::string() : xml.substr(start, e - start);
}

struct CurlDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

}  // namespace

std::string S3Url::key(std::string_view name) const {
  return prefix.empty() ? std::string(name) : prefix + "/" + std::string(name);
}

std::string S3Url::str() const {
  return "s3://" + bucket + (prefix.empty() ? "" : "/" + prefix);
}

bool is_s3_url(std::string_view s) {
  return s.starts_with("s3://");
}

S3Url parse_s3_url(std::string_view s) {
  if (!is_s3_url(s)) throw Error(Errc::kUsage, "not an s3:// URL: " + std::string(s));
  std::string_view rest = s.substr(5);
  const auto slash = rest.find('/');
  S3Url u;
  u.bucket = std::string(rest.substr(0, slash));
  if (!valid_bucket(u.bucket))
    throw Error(Errc::kUsage, "bad bucket name '" + u.bucket + "' in " + std::string(s) +
                                  " (3-63 lower-case letters, digits, '-' and '.')");
  std::string prefix = slash == std::string_view::npos ? "" : std::string(rest.substr(slash + 1));
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  for (std::size_t start = 0; start < prefix.size();) {
    auto end = prefix.find('/', start);
    if (end == std::string::npos) end = prefix.size();
    const std::string part = prefix.substr(start, end - start);
    if (part.empty() || part == "." || part == "..")
      throw Error(Errc::kUsage, "bad prefix in " + std::string(s) +
                                    ": empty, '.' or '..' components are not allowed");
    start = end + 1;
  }
  u.prefix = prefix;
  return u;
}

S3Config S3Config::from_environment() {
  S3Config c;
  const std::string profile = env_or("AWS_PROFILE", "default");
  const auto creds = read_ini(home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"));
  const auto config = read_ini(home_file("AWS_CONFIG_FILE", ".aws/config"));
  auto from = [](const auto& ini, const std::string& section, const char* key) -> std::string {
    const auto s = ini.find(section);
    if (s == ini.end()) return {};
    const auto v = s->second.find(key);
    return v == s->second.end() ? std::string() : v->second;
  };
  const std::string conf_section = profile == "default" ? "default" : "profile " + profile;

  c.access_key = env_or("AWS_ACCESS_KEY_ID");
  c.secret_key = env_or("AWS_SECRET_ACCESS_KEY");
  c.session_token = env_or("AWS_SESSION_TOKEN");
  if (c.access_key.empty() || c.secret_key.empty()) {
    c.access_key = from(creds, profile, "aws_access_key_id");
    c.secret_key = from(creds, profile, "aws_secret_access_key");
    c.session_token = from(creds, profile, "aws_session_token");
  }
  if (c.access_key.empty() || c.secret_key.empty())
    throw Error(Errc::kInvalidInput,
                "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give "
                "profile '" +
                    profile + "' keys in " +
                    home_file("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials"));

  c.region =
      env_or("AWS_REGION", env_or("AWS_DEFAULT_REGION", from(config, conf_section, "region")));
  if (c.region.empty()) c.region = "us-east-1";
  c.endpoint = env_or("AWS_ENDPOINT_URL_S3",
                      env_or("AWS_ENDPOINT_URL", from(config, conf_section, "endpoint_url")));
  if (c.endpoint.empty()) {
    c.endpoint = "https://s3." + c.region + ".amazonaws.com";
    c.path_style = false;
  }
  while (!c.endpoint.empty() && c.endpoint.back() == '/') c.endpoint.pop_back();
  if (!c.endpoint.starts_with("http://") && !c.endpoint.starts_with("https://"))
    throw Error(Errc::kUsage,
                "S3 endpoint '" + c.endpoint + "' must start with http:// or https://");
  return c;
}

struct S3Client::Request {
  const char* method = "GET";
  std::string bucket, key, query;
  std::vector<std::string> headers;
  // Body: from memory, or `len` bytes of `fd` from `offset`.
  std::string_view body;
  int fd = -1;
  std::uint64_t offset = 0, len = 0;
  // Answer body: into memory (capped), or to `out_fd` at `out_offset` (ranged GET).
  std::uint64_t max_body = 1 << 20;
  int out_fd = -1;
  std::uint64_t out_offset = 0, out_len = 0;
  bool head = false;
  // Set from another thread: the transfer stops within moments instead of running to its end.
  const std::atomic<bool>* cancel = nullptr;

  // Transfer state of one attempt.
  std::uint64_t sent = 0, received = 0;
  long status = 0;  // the last attempt's HTTP status
  std::string write_error;
  bool callback_threw = false;
};

namespace {

// libcurl's callbacks run inside its C frames, which an exception must not cross. A callback
// that throws (an allocation failing) fails its transfer as if it had returned `failed`.
template <class R, class F>
R in_callback(bool& threw, R failed, F&& body) noexcept {
  try {
    return body();
  } catch (...) {
    threw = true;
    return failed;
  }
}

}  // namespace

S3Client::S3Client(S3Config c) : c_(std::move(c)) {
  global_init();
}

std::string S3Client::url(const std::string& bucket, const std::string& key,
                          const std::string& query) const {
  std::string u;
  if (c_.path_style) {
    u = c_.endpoint + "/" + bucket;
  } else {
    const auto scheme_end = c_.endpoint.find("://") + 3;
    u = c_.endpoint.substr(0, scheme_end) + bucket + "." + c_.endpoint.substr(scheme_end);
  }
  if (!key.empty()) u += "/" + uri_encode(key, true);
  if (!query.empty()) u += "?" + query;
  return u;
}

// One attempt of a request: a libcurl handle set up for it, whose callbacks fill the answer and
// the request's transfer state. The callbacks run inside libcurl's C frames: each catches what
// it throws (in_callback).
class S3Client::Transfer {
 public:
  Transfer(const S3Client& client, Request& r) : r_(r), h_(curl_easy_init()) {
    if (!h_) throw Error(Errc::kInternal, "curl_easy_init failed");
    r_.sent = r_.received = 0;
    r_.write_error.clear();
    r_.callback_threw = false;
    set_request(client);
    set_body();
    set_answer();
  }

  // Runs the transfer; the answer holds its status and what was read into memory.
  CURLcode run() {
    const CURLcode rc = curl_easy_perform(h_.get());
    if (r_.callback_threw && r_.write_error.empty())
      r_.write_error = "out of memory in a transfer callback";  // not retried
    long status = 0;
    curl_easy_getinfo(h_.get(), CURLINFO_RESPONSE_CODE, &status);
    resp_.status = r_.status = status;
    curl_off_t length = -1;
    if (curl_easy_getinfo(h_.get(), CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) == CURLE_OK)
      resp_.content_length = length;
    return rc;
  }

  Response& response() { return resp_; }

 private:
  void add_header(const std::string& hdr) {
    curl_slist* n = curl_slist_append(hdrs_.get(), hdr.c_str());
    if (!n) throw Error(Errc::kInternal, "curl_slist_append failed");
    (void)hdrs_.release();  // n now heads the same list
    hdrs_.reset(n);
  }

  // Where, signed how, with which headers and bounds.
  void set_request(const S3Client& client) {
    const S3Config& c = client.c_;
    // libcurl signs with SigV4 but, in Debian 12's 7.88, does not send the payload hash that
    // S3 requires; the body is covered by the checkpoint's own chunk checksums instead.
    add_header("x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!c.session_token.empty()) add_header("x-amz-security-token: " + c.session_token);
    for (const auto& x : r_.headers) add_header(x);
    add_header("Expect:");  // no 100-continue round trip per part
    CURL* e = h_.get();
    // libcurl copies string options.
    curl_easy_setopt(e, CURLOPT_URL, client.url(r_.bucket, r_.key, r_.query).c_str());
    curl_easy_setopt(e, CURLOPT_AWS_SIGV4, ("aws:amz:" + c.region + ":s3").c_str());
    curl_easy_setopt(e, CURLOPT_USERPWD, (c.access_key + ":" + c.secret_key).c_str());
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, 10L);
    // A stalled transfer (under 1 KiB/s for 30 s) is an error, not a hang.
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, 30L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs_.get());
    if (r_.cancel) {
      // libcurl calls this at least once a second, data or not: a stalled range stops too.
      curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
      curl_easy_setopt(e, CURLOPT_XFERINFODATA, this);
      curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, &Transfer::on_progress);
    }
  }

  // The method and what it sends: nothing, memory, or a range of a file.
  void set_body() {
    CURL* e = h_.get();
    const std::string_view method(r_.method);
    if (r_.head) {
      curl_easy_setopt(e, CURLOPT_NOBODY, 1L);  // HEAD as libcurl makes it: no body awaited
      return;
    }
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r_.method);
    if (r_.fd >= 0 || !r_.body.empty() || method == "PUT") {
      curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(body_size()));
      curl_easy_setopt(e, CURLOPT_READDATA, this);
      curl_easy_setopt(e, CURLOPT_READFUNCTION, &Transfer::on_read);
    } else if (method == "POST") {
      curl_easy_setopt(e, CURLOPT_POSTFIELDS, "");
      curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, 0L);
    }
  }

  // Where the answer goes: its status and ETag from the headers, its body to memory or a file.
  void set_answer() {
    CURL* e = h_.get();
    curl_easy_setopt(e, CURLOPT_WRITEDATA, this);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &Transfer::on_write);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, this);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &Transfer::on_header);
  }

  std::uint64_t body_size() const { return r_.fd >= 0 ? r_.len : r_.body.size(); }

  static size_t on_read(char* buf, size_t sz, size_t n, void* p) noexcept {
    Request& q = static_cast<Transfer*>(p)->r_;
    const std::size_t want = static_cast<std::size_t>(
        std::min<std::uint64_t>(sz * n, static_cast<Transfer*>(p)->body_size() - q.sent));
    if (want == 0) return 0;
    if (q.fd < 0) {
      std::memcpy(buf, q.body.data() + q.sent, want);
      q.sent += want;
      return want;
    }
    for (;;) {
      const ssize_t got = ::pread(q.fd, buf, want, static_cast<off_t>(q.offset + q.sent));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return CURL_READFUNC_ABORT;
      q.sent += static_cast<std::uint64_t>(got);
      return static_cast<size_t>(got);
    }
  }

  static size_t on_write(char* buf, size_t sz, size_t n, void* p) noexcept {
    auto* t = static_cast<Transfer*>(p);
    return in_callback(t->r_.callback_threw, size_t{0},
                       [&]() -> size_t { return t->take(buf, sz * n); });
  }

  // Error answers always go to memory, to be reported.
  size_t take(const char* buf, std::size_t len) {
    Request& q = r_;
    if (q.out_fd >= 0 && resp_.status / 100 == 2) {
      if (q.received + len > q.out_len) {
        q.write_error = "the server sent more bytes than the range asked for";
        return 0;
      }
      if (const int err = pwrite_fully(q.out_fd, buf, len, q.out_offset + q.received)) {
        q.write_error = std::string("write: ") + std::strerror(err);
        return 0;
      }
    } else {
      if (resp_.body.size() + len > q.max_body) {
        q.write_error = "the answer is larger than " + std::to_string(q.max_body) + " bytes";
        return 0;
      }
      resp_.body.append(buf, len);
    }
    q.received += len;
    return len;
  }

  static int on_progress(void* p, curl_off_t, curl_off_t, curl_off_t, curl_off_t) noexcept {
    Request& q = static_cast<Transfer*>(p)->r_;
    return in_callback(q.callback_threw, 1, [&] {
      if (!q.cancel->load()) return 0;
      q.write_error = "cancelled in flight";  // not retried
      return 1;
    });
  }

  static size_t on_header(char* buf, size_t sz, size_t n, void* p) noexcept {
    auto* t = static_cast<Transfer*>(p);
    return in_callback(t->r_.callback_threw, size_t{0}, [&]() -> size_t {
      std::string_view line(buf, sz * n);
      if (line.starts_with("HTTP/")) {  // a new status line (after 100 or a redirect)
        const auto sp = line.find(' ');
        t->resp_.status = sp == std::string_view::npos ? 0 : std::atol(line.data() + sp + 1);
      } else if (line.size() > 5 && ::strncasecmp(line.data(), "etag:", 5) == 0) {
        t->resp_.etag = trim(std::string(line.substr(5)));  // header names: any case
      }
      return sz * n;
    });
  }

  Request& r_;
  Response resp_;
  std::unique_ptr<CURL, CurlDeleter> h_;
  std::unique_ptr<curl_slist, SlistDeleter> hdrs_;
};

namespace {

// The error an HTTP answer other than success stands for, with S3's code and message.
Error answer_error(const char* method, const std::string& where, long status,
                   const std::string& body) {
  const std::string code = xml_value(body, "Code"), msg = xml_value(body, "Message");
  std::string what = std::string(method) + " " + where + ": HTTP " + std::to_string(status);
  if (!code.empty()) what += " " + code;
  if (!msg.empty()) what += ": " + msg;
  if (status == 403 || status == 401)
    return Error(Errc::kInvalidInput, what + " (check the S3 credentials and the bucket policy)");
  if (status == 404) return Error(Errc::kInvalidInput, what);
  return Error(Errc::kIo, what);
}

}  // namespace

S3Client::Response S3Client::perform(Request& r) const {
  const std::string where = "s3://" + r.bucket + "/" + r.key;
  auto stop_if_cancelled = [&] {
    if (r.cancel && r.cancel->load())
      throw Error(Errc::kIo, std::string(r.method) + " " + where + ": cancelled");
  };
  for (int attempt = 1;; ++attempt) {
    stop_if_cancelled();
    Transfer t(*this, r);
    const CURLcode rc = t.run();
    const long status = r.status;
    const bool retryable =
        rc != CURLE_OK ? r.write_error.empty() : (status >= 500 || status == 429 || status == 408);
    if (retryable) stop_if_cancelled();  // no back-off before saying so
    if (retryable && attempt < kAttempts) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200 << attempt));  // back off
      continue;
    }
    if (rc != CURLE_OK) {
      if (!r.write_error.empty())
        throw Error(Errc::kIo, std::string(r.method) + " " + where + ": " + r.write_error);
      throw Error(Errc::kIo, std::string(r.method) + " " + where + " (" + c_.endpoint +
                                 "): " + curl_easy_strerror(rc));
    }
    if (status / 100 == 2 || (status == 404 && (r.head || std::string_view(r.method) == "DELETE")))
      return std::move(t.response());
    throw answer_error(r.method, where, status, t.response().body);
  }
}

std::optional<std::uint64_t> S3Client::head(const std::string& bucket,
                                            const std::string& key) const {
  Request r;
  r.method = "HEAD";
  r.head = true;
  r.bucket = bucket;
  r.key = key;
  const Response resp = perform(r);
  if (resp.status == 404) return std::nullopt;
  if (resp.content_length < 0)
    throw Error(Errc::kIo, "HEAD s3://" + bucket + "/" + key + ": no Content-Length");
  return static_cast<std::uint64_t>(resp.content_length);
}

bool S3Client::bucket_exists(const std::string& bucket) const {
  Request r;
  r.method = "HEAD";
  r.head = true;
  r.bucket = bucket;
  return perform(r).status != 404;
}

std::string S3Client::get(const std::string& bucket, const std::string& key,
                          std::uint64_t max_bytes) const {
  Request r;
  r.bucket = bucket;
  r.key = key;
  r.max_body = max_bytes;
  try {
    return perform(r).body;
  } catch (const Error& e) {
    if (r.write_error.starts_with("the answer is larger"))
      throw Error(Errc::kCorrupt, "s3://" + bucket + "/" + key + " is larger than " +
                                      std::to_string(max_bytes) + " bytes");
    throw;
  }
}

void S3Client::get_range_to_fd(const std::string& bucket, const std::string& key,
                               std::uint64_t offset, std::uint64_t len, int fd,
                               std::uint64_t fd_offset, const std::atomic<bool>* cancel) const {
  if (len == 0) return;
  Request r;
  r.cancel = cancel;
  r.bucket = bucket;
  r.key = key;
  r.headers.push_back("Range: bytes=" + std::to_string(offset) + "-" +
                      std::to_string(offset + len - 1));
  r.out_fd = fd;
  r.out_offset = fd_offset;
  r.out_len = len;
  perform(r);
  if (r.received != len)
    throw Error(Errc::kCorrupt, "s3://" + bucket + "/" + key + ": asked for " +
                                    std::to_string(len) + " bytes at " + std::to_string(offset) +
                                    ", got " + std::to_string(r.received) +
                                    " (the object is shorter than its manifest says)");
}

void S3Client::put(const std::string& bucket, const std::string& key, std::string_view data) const {
  Request r;
  r.method = "PUT";
  r.bucket = bucket;
  r.key = key;
  r.body = data;
  perform(r);
}

void S3Client::put_from_fd(const std::string& bucket, const std::string& key, int fd,
                           std::uint64_t offset, std::uint64_t len) const {
  Request r;
  r.method = "PUT";
  r.bucket = bucket;
  r.key = key;
  r.fd = fd;
  r.offset = offset;
  r.len = len;
  perform(r);
}

void S3Client::remove(const std::string& bucket, const std::string& key) const {
  Request r;
  r.method = "DELETE";
  r.bucket = bucket;
  r.key = key;
  perform(r);
}

bool S3Client::put_if_absent(const std::string& bucket, const std::string& key,
                             std::string_view data) const {
  Request r;
  r.method = "PUT";
  r.bucket = bucket;
  r.key = key;
  r.body = data;
  r.headers.push_back("If-None-Match: *");
  try {
    perform(r);
  } catch (const Error&) {
    if (r.status != 412 && r.status != 409) throw;
    // A PUT retried after its answer was lost meets its own object: that is a success.
    try {
      return get(bucket, key, data.size() + 1) == data;
    } catch (const Error&) {
      return false;  // gone again, or larger than ours: not ours
    }
  }
  return true;
}

std::vector<std::string> S3Client::list(const std::string& bucket,
                                        const std::string& prefix) const {
  std::vector<std::string> keys;
  std::string token;
  for (;;) {
    Request r;
    r.bucket = bucket;
    r.max_body = 16 << 20;
    // SigV4 signs the query in sorted order: keep it so.
    r.query = (token.empty() ? "" : "continuation-token=" + uri_encode(token, false) + "&") +
              "list-type=2&prefix=" + uri_encode(prefix, false);
    const std::string xml = perform(r).body;
    for (std::size_t at = 0;;) {
      const auto open = xml.find("<Key>", at);
      if (open == std::string::npos) break;
      const auto close = xml.find("</Key>", open);
      if (close == std::string::npos) break;
      keys.push_back(xml_unescape(xml.substr(open + 5, close - open - 5)));
      at = close + 6;
    }
    if (xml_value(xml, "IsTruncated") != "true") break;
    token = xml_unescape(xml_value(xml, "NextContinuationToken"));
    if (token.empty())
      throw Error(Errc::kIo, "listing s3://" + bucket + "/" + prefix +
                                 ": a truncated answer without a continuation token");
  }
  return keys;
}

std::string S3Client::create_multipart(const std::string& bucket, const std::string& key) const {
  Request r;
  r.method = "POST";
  r.bucket = bucket;
  r.key = key;
  r.query = "uploads=";
  const Response resp = perform(r);
  std::string id = xml_value(resp.body, "UploadId");
  if (id.empty())
    throw Error(Errc::kIo, "s3://" + bucket + "/" + key + ": no UploadId in the answer");
  return id;
}

std::string S3Client::upload_part(const std::string& bucket, const std::string& key,
                                  const std::string& upload_id, unsigned part_number, int fd,
                                  std::uint64_t offset, std::uint64_t len) const {
  Request r;
  r.method = "PUT";
  r.bucket = bucket;
  r.key = key;
  r.query =
      "partNumber=" + std::to_string(part_number) + "&uploadId=" + uri_encode(upload_id, false);
  r.fd = fd;
  r.offset = offset;
  r.len = len;
  const Response resp = perform(r);
  if (resp.etag.empty())
    throw Error(Errc::kIo,
                "s3://" + bucket + "/" + key + ": no ETag for part " + std::to_string(part_number));
  return resp.etag;
}

void S3Client::complete_multipart(const std::string& bucket, const std::string& key,
                                  const std::string& upload_id,
                                  const std::vector<std::string>& etags) const {
  std::string xml = "<CompleteMultipartUpload>";
  for (std::size_t i = 0; i < etags.size(); ++i)
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + etags[i] +
           "</ETag></Part>";
  xml += "</CompleteMultipartUpload>";
  Request r;
  r.method = "POST";
  r.bucket = bucket;
  r.key = key;
  r.query = "uploadId=" + uri_encode(upload_id, false);
  r.body = xml;
  r.headers.push_back("Content-Type: application/xml");
  const Response resp = perform(r);
  // S3 may answer 200 and still fail the completion, with an <Error> body.
  if (resp.body.find("<Error>") != std::string::npos)
    throw Error(Errc::kIo, "s3://" + bucket + "/" + key +
                               ": completing the upload failed: " + xml_value(resp.body, "Code") +
                               " " + xml_value(resp.body, "Message"));
}

void S3Client::abort_multipart(const std::string& bucket, const std::string& key,
                               const std::string& upload_id) const noexcept {
  try {
    Request r;
    r.method = "DELETE";
    r.bucket = bucket;
    r.key = key;
    r.query = "uploadId=" + uri_encode(upload_id, false);
    perform(r);
  } catch (...) {  // best effort: an unfinished upload is invisible, and lifecycle rules end it
  }
}

}  // namespace gpuckpt::remote
