// An S3 client for checkpoints: libcurl with its built-in AWS SigV4 signing (no home-made
// cryptography), path-style or virtual-hosted addressing, multipart uploads and ranged reads.
// Each call is one request on its own easy handle, so calls may run on several threads at
// once; the parallelism lives in remote/remote_checkpoint.h.
//
// Configuration comes from where the AWS tools read it (docs/OPERATORS.md, "Object storage"):
//   credentials  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, else the
//                AWS_PROFILE (default "default") section of AWS_SHARED_CREDENTIALS_FILE
//                (default ~/.aws/credentials);
//   region       AWS_REGION, AWS_DEFAULT_REGION, else `region` in AWS_CONFIG_FILE
//                (default ~/.aws/config), else us-east-1;
//   endpoint     AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, else `endpoint_url` in the config
//                file, else https://s3.REGION.amazonaws.com. A custom endpoint is addressed
//                path-style (http://host:port/bucket/key), as S3-compatible servers expect.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpuckpt::remote {

// s3://bucket/prefix: the objects of one checkpoint are prefix/manifest.json, ... .
struct S3Url {
  std::string bucket, prefix;  // prefix without leading or trailing '/', may be empty
  std::string key(std::string_view name) const;  // prefix + "/" + name
  std::string str() const;                       // "s3://bucket/prefix"
};

bool is_s3_url(std::string_view s);
// Error(kUsage) for anything that is not s3://BUCKET[/PREFIX] with a valid bucket name and a
// prefix without empty, "." or ".." components.
S3Url parse_s3_url(std::string_view s);

struct S3Config {
  std::string endpoint;  // scheme://host[:port], no trailing '/'
  bool path_style = true;
  std::string region = "us-east-1";
  std::string access_key, secret_key, session_token;
  // Reads the environment and the AWS files as described above. Error(kInvalidInput) when no
  // credentials are found.
  static S3Config from_environment();
};

class S3Client {
 public:
  explicit S3Client(S3Config c);
  const S3Config& config() const { return c_; }

  // The object's size, or nullopt when it does not exist (404).
  std::optional<std::uint64_t> head(const std::string& bucket, const std::string& key) const;
  // Whether the bucket exists (HeadBucket). A HEAD of an object answers 404 alike for a missing
  // object and a missing bucket, having no body to say which.
  bool bucket_exists(const std::string& bucket) const;
  // A whole object into memory; Error(kInvalidInput) when it does not exist, Error(kCorrupt)
  // when it is larger than `max_bytes`.
  std::string get(const std::string& bucket, const std::string& key, std::uint64_t max_bytes) const;
  // Bytes [offset, offset+len) of the object, written to `fd` at `fd_offset` (pwrite). Setting
  // `*cancel` stops it within about a second, with Error(kIo) "... cancelled".
  void get_range_to_fd(const std::string& bucket, const std::string& key, std::uint64_t offset,
                       std::uint64_t len, int fd, std::uint64_t fd_offset,
                       const std::atomic<bool>* cancel = nullptr) const;
  void put(const std::string& bucket, const std::string& key, std::string_view data) const;
  // `len` bytes of `fd` from `offset` as one object.
  void put_from_fd(const std::string& bucket, const std::string& key, int fd, std::uint64_t offset,
                   std::uint64_t len) const;
  void remove(const std::string& bucket, const std::string& key) const;  // absent is fine
  // PUT only where no object is at `key` (If-None-Match: *): false when the store says one is
  // (412, or 409 for a concurrent conditional write) and it is not `data` (a retried PUT whose
  // first try landed finds its own object, which is a success). A store that ignores the header
  // answers as for a plain PUT: callers that must know check otherwise too.
  bool put_if_absent(const std::string& bucket, const std::string& key,
                     std::string_view data) const;
  // The keys under `prefix` (ListObjectsV2, every page), in the store's order.
  std::vector<std::string> list(const std::string& bucket, const std::string& prefix) const;

  // Multipart upload: create, upload parts 1..N (each >= 5 MiB but the last), then complete
  // with their ETags in order, or abort.
  std::string create_multipart(const std::string& bucket, const std::string& key) const;
  std::string upload_part(const std::string& bucket, const std::string& key,
                          const std::string& upload_id, unsigned part_number, int fd,
                          std::uint64_t offset, std::uint64_t len) const;  // the part's ETag
  void complete_multipart(const std::string& bucket, const std::string& key,
                          const std::string& upload_id,
                          const std::vector<std::string>& etags) const;
  void abort_multipart(const std::string& bucket, const std::string& key,
                       const std::string& upload_id) const noexcept;

 private:
  struct Request;
  class Transfer;
  struct Response {
    long status = 0;
    std::string body, etag;
    std::int64_t content_length = -1;
  };
  // One signed request with retries of transport errors and 5xx/429 answers (every request
  // made here is idempotent, multipart creation aside, whose retry only leaves an unused
  // upload id).
  Response perform(Request& r) const;
  std::string url(const std::string& bucket, const std::string& key,
                  const std::string& query) const;

  S3Config c_;
};

}  // namespace gpuckpt::remote
