// Checkpoints in object storage, against a real S3-compatible server (s3rver) that the tests
// start on loopback: URLs, configuration from the AWS environment and files, multipart uploads
// with the manifest last, ranged parallel downloads, replacement, and damaged objects.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <list>
#include <nlohmann/json.hpp>
#include <thread>

#include "gpuckpt/error.h"
#include "gpuckpt/image.h"
#include "image/event_fd.h"
#include "remote/remote_checkpoint.h"
#include "remote/s3.h"
#include "test_support.h"
#include "util/unique_fd.h"

namespace fs = std::filesystem;
using namespace gpuckpt;
using namespace gpuckpt::remote;

namespace {

Errc code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  return Errc::kOk;
}

// A network path to the store that stops carrying blob bytes: a TCP relay on loopback in front
// of the real server that forwards every request, and every answer except those to a ranged GET
// of a blob, of which it forwards the first 64 KiB and then nothing, holding the connection open
// as a stalled link does.
class StallingRelay {
 public:
  explicit StallingRelay(int upstream_port) : upstream_(upstream_port) {
    listen_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (!listen_ || ::bind(listen_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_.get(), 16) != 0 ||
        ::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw_errno(Errc::kIo, "the relay's socket");
    port_ = ntohs(a.sin_port);
    accept_ = std::thread([this] { accept_loop(); });
  }
  ~StallingRelay() {
    stop_.notify();
    accept_.join();
    for (auto& t : conns_) t.join();
  }
  int port() const { return port_; }
  int stalled() const { return stalled_; }

 private:
  bool wait_readable(int fd) {
    pollfd p[2] = {{fd, POLLIN, 0}, {stop_.fd(), POLLIN, 0}};
    while (::poll(p, 2, -1) < 0)
      if (errno != EINTR) return false;
    return !(p[1].revents & POLLIN);
  }
  void accept_loop() {
    while (wait_readable(listen_.get())) {
      UniqueFd c(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (c)
        conns_.emplace_back(
            [this, c = std::make_shared<UniqueFd>(std::move(c))] { relay(c->get()); });
    }
  }
  void relay(int client) {
    UniqueFd up(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(upstream_));
    if (!up || ::connect(up.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    // One request per connection (gpuckpt's client opens one for each): its first bytes say
    // whether the answer is a blob's range.
    bool stall = false, decided = false;
    std::uint64_t answered = 0;
    char buf[65536];
    pollfd p[3] = {{client, POLLIN, 0}, {up.get(), POLLIN, 0}, {stop_.fd(), POLLIN, 0}};
    for (;;) {
      if (::poll(p, 3, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (p[2].revents & POLLIN) return;
      if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        const ssize_t n = ::read(client, buf, sizeof buf);
        if (n <= 0) return;
        if (!decided) {
          const std::string head(buf, static_cast<std::size_t>(n));
          stall = head.starts_with("GET ") && head.find("/blob-") != std::string::npos &&
                  head.find("Range:") != std::string::npos;
          decided = true;
          if (stall) ++stalled_;
        }
        if (::send(up.get(), buf, static_cast<std::size_t>(n), MSG_NOSIGNAL) != n) return;
      }
      if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {
        if (stall && answered >= (64u << 10)) {
          p[1].fd = -1;  // stalled: the server's bytes stay where they are, and poll ignores it
          continue;
        }
        const ssize_t n = ::read(up.get(), buf, sizeof buf);
        if (n <= 0) return;
        if (::send(client, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL) != n) return;
        answered += static_cast<std::uint64_t>(n);
      }
    }
  }

  int upstream_, port_ = 0;
  UniqueFd listen_;
  image::EventFd stop_;
  std::atomic<int> stalled_{0};
  std::thread accept_;
  std::list<std::thread> conns_;
};

class S3Store : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.emplace("ckpts");
    server_->export_environment();
    dir_ = test::scratch_dir("gpuckpt-s3store");
  }
  // A checkpoint of `bytes` of test data, in blobs of at most `max_blob` bytes.
  fs::path make_checkpoint(const std::string& name, std::uint64_t bytes,
                           std::uint64_t max_blob = 1ull << 30, std::uint64_t seed = 1) {
    const fs::path src = dir_.path() / (name + "-src");
    fs::create_directories(src);
    test::write_test_file(src / "pages-1.img", bytes, seed);
    test::write_test_file(src / "core-1.img", 5000, seed + 1);
    PackOptions po;
    po.chunk_bytes = 1u << 20;
    po.max_blob_bytes = max_blob;
    const fs::path ckpt = dir_.path() / name;
    pack(src, ckpt, po);
    return ckpt;
  }
  S3Client client() const { return S3Client(S3Config::from_environment()); }

  std::optional<test::S3Server> server_;
  TempDir dir_;
};

}  // namespace

TEST(S3Url, ParsesBucketAndPrefixAndRejectsWhatS3CannotName) {
  const S3Url u = parse_s3_url("s3://fleet-ckpts/node7/vllm/");
  EXPECT_EQ(u.bucket, "fleet-ckpts");
  EXPECT_EQ(u.prefix, "node7/vllm");
  EXPECT_EQ(u.key("manifest.json"), "node7/vllm/manifest.json");
  EXPECT_EQ(u.str(), "s3://fleet-ckpts/node7/vllm");
  EXPECT_EQ(parse_s3_url("s3://bkt").key("x"), "x");
  EXPECT_TRUE(is_s3_url("s3://b/p"));
  EXPECT_FALSE(is_s3_url("/srv/ckpt"));
  for (const char* bad : {"s3://", "s3://Upper/x", "s3://ab/x", "s3://b_x/y", "s3://bkt/a//b",
                          "s3://bkt/a/../b", "s3://bkt/./b", "/local/path"})
    EXPECT_EQ(code_of([&] { parse_s3_url(bad); }), Errc::kUsage) << bad;
}

TEST(S3Config, ReadsCredentialsRegionAndEndpointFromTheAwsFilesOfTheProfile) {
  const TempDir d = test::scratch_dir("gpuckpt-awsfiles");
  std::ofstream(d.path() / "credentials") << "[default]\naws_access_key_id = AKDEFAULT\n"
                                             "aws_secret_access_key = sdefault\n\n"
                                             "[fleet]\naws_access_key_id=AKFLEET\n"
                                             "aws_secret_access_key=sfleet\n"
                                             "aws_session_token = tok\n";
  std::ofstream(d.path() / "config") << "[profile fleet]\nregion = eu-west-3\n"
                                        "endpoint_url = http://127.0.0.1:9/\n";
  for (const char* v :
       {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
        "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"})
    ::unsetenv(v);
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", (d.path() / "credentials").c_str(), 1);
  ::setenv("AWS_CONFIG_FILE", (d.path() / "config").c_str(), 1);
  ::setenv("AWS_PROFILE", "fleet", 1);
  S3Config c = S3Config::from_environment();
  EXPECT_EQ(c.access_key, "AKFLEET");
  EXPECT_EQ(c.secret_key, "sfleet");
  EXPECT_EQ(c.session_token, "tok");
  EXPECT_EQ(c.region, "eu-west-3");
  EXPECT_EQ(c.endpoint, "http://127.0.0.1:9");
  EXPECT_TRUE(c.path_style);

  // The environment wins over the files; AWS itself is addressed virtual-hosted.
  ::unsetenv("AWS_PROFILE");
  ::setenv("AWS_ACCESS_KEY_ID", "AKENV", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "senv", 1);
  ::setenv("AWS_REGION", "ap-south-1", 1);
  c = S3Config::from_environment();
  EXPECT_EQ(c.access_key, "AKENV");
  EXPECT_EQ(c.region, "ap-south-1");
  EXPECT_EQ(c.endpoint, "https://s3.ap-south-1.amazonaws.com");
  EXPECT_FALSE(c.path_style);

  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent", 1);
  try {
    S3Config::from_environment();
    FAIL() << "no credentials must be an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("AWS_ACCESS_KEY_ID"), std::string::npos) << e.what();
  }
}

TEST_F(S3Store, MultipartUploadThenRangedParallelDownloadIsByteForByte) {
  // 24 MiB in blobs of at most 12 MiB: each blob goes up in 5 MiB parts.
  const fs::path ckpt = make_checkpoint("a", 24u << 20, 12u << 20);
  const S3Url url = parse_s3_url("s3://ckpts/site/a");
  TransferOptions o;
  o.connections = 4;
  o.part_bytes = 5u << 20;
  const S3Client s3 = client();
  const TransferStats up = upload_checkpoint(s3, ckpt, url, false, o);
  const ImageInfo info = inspect(ckpt);
  ASSERT_GE(info.blob_count, 2u);
  EXPECT_EQ(up.objects, info.blob_count + 2);  // blobs, seal, manifest
  // create + parts + complete per blob, more than one PUT per object.
  EXPECT_GT(up.requests, up.objects + 2 * info.blob_count);
  EXPECT_EQ(s3.head("ckpts", "site/a/blob-000000.bin"), fs::file_size(ckpt / "blob-000000.bin"));

  const fs::path back = dir_.path() / "back";
  fs::create_directories(back);
  const TransferStats down = download_checkpoint(s3, url, back, o);
  EXPECT_EQ(down.bytes, up.bytes);
  for (const auto& e : fs::directory_iterator(ckpt))
    EXPECT_TRUE(test::same_contents(e.path(), back / e.path().filename())) << e.path();
  EXPECT_EQ(verify(back).raw_bytes, info.raw_bytes);
}

TEST_F(S3Store, ADownloadIsReadAsItArrivesAndAMissingBlobFailsWhatWaitsForIt) {
  const fs::path ckpt = make_checkpoint("f", 12u << 20, 5u << 20);
  const S3Url url = parse_s3_url("s3://ckpts/f");
  const S3Client s3 = client();
  TransferOptions o;
  o.connections = 3;
  o.part_bytes = 5u << 20;
  upload_checkpoint(s3, ckpt, url, false, o);
  const std::size_t blobs = inspect(ckpt).blob_count;
  ASSERT_GE(blobs, 2u);
  {  // read as it arrives: every blob's whole prefix, then the same bytes as uploaded
    const fs::path back = dir_.path() / "arriving";
    fs::create_directories(back);
    Download d(s3, url, back, o);
    d.start();
    for (std::size_t b = 0; b < blobs; ++b)
      d.arrival().wait(b, 0, fs::file_size(ckpt / ("blob-00000" + std::to_string(b) + ".bin")));
    d.join();
    for (const auto& e : fs::directory_iterator(ckpt))
      EXPECT_TRUE(test::same_contents(e.path(), back / e.path().filename())) << e.path();
  }
  // The last blob is gone from the store: a reader waiting for it fails, it does not hang.
  s3.remove("ckpts", "f/blob-00000" + std::to_string(blobs - 1) + ".bin");
  const fs::path back = dir_.path() / "missing";
  fs::create_directories(back);
  Download d(s3, url, back, o);
  d.start();
  EXPECT_EQ(code_of([&] { d.arrival().wait(blobs - 1, 0, 1); }), Errc::kIo);
  EXPECT_NE(code_of([&] { d.join(); }), Errc::kOk);
}

TEST_F(S3Store, ACancelledDownloadStopsTheRangesInFlightInsteadOfWaitingForThem) {
  // A failed restore cancels its download. Ranges on a stalled link would otherwise hold it
  // until libcurl's stall timeout (30 s) and then report that instead of the restore's error.
  const fs::path ckpt = make_checkpoint("c", 12u << 20, 6u << 20);
  const S3Url url = parse_s3_url("s3://ckpts/c");
  upload_checkpoint(client(), ckpt, url, false, {});
  const std::string endpoint = S3Config::from_environment().endpoint;
  StallingRelay relay(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
  S3Config via = S3Config::from_environment();
  via.endpoint = "http://127.0.0.1:" + std::to_string(relay.port());
  const S3Client s3(via);
  TransferOptions o;
  o.connections = 2;
  o.part_bytes = 6u << 20;
  const fs::path back = dir_.path() / "cancelled";
  fs::create_directories(back);
  Download d(s3, url, back, o);  // the manifest comes through the relay
  d.start();
  ASSERT_TRUE(test::wait_until([&] { return relay.stalled() >= 2; }));
  d.cancel();
  try {
    d.join();
    FAIL() << "a cancelled download must not succeed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::kIo);
    // Stopped in flight, not after libcurl's stall timeout (that one says "cancelled" too, but
    // only once the range has failed and is about to be retried).
    EXPECT_NE(std::string(e.what()).find("cancelled in flight"), std::string::npos) << e.what();
  }
}

TEST_F(S3Store, CliInspectAndVerifyReadTheCheckpointFromTheStore) {
  const fs::path ckpt = make_checkpoint("b", 6u << 20);
  upload_checkpoint(client(), ckpt, parse_s3_url("s3://ckpts/b"), false);
  auto r = test::run_cli({"inspect", "s3://ckpts/b", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("raw_bytes"), inspect(ckpt).raw_bytes);
  EXPECT_EQ(j.at("sealed"), true);
  r = test::run_cli({"verify", "s3://ckpts/b", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto v = nlohmann::json::parse(r.out);
  EXPECT_EQ(v.at("timeline").at("stages").at(0).at("name"), "download");

  r = test::run_cli({"inspect", "s3://ckpts/nothing-here"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("is not a gpuckpt checkpoint"), std::string::npos) << r.err;
}

TEST_F(S3Store, ADamagedBlobInTheStoreFailsVerification) {
  const fs::path ckpt = make_checkpoint("c", 4u << 20);
  const S3Client s3 = client();
  upload_checkpoint(s3, ckpt, parse_s3_url("s3://ckpts/c"), false);
  std::string blob = read_file(ckpt / "blob-000000.bin");
  blob[blob.size() / 2] ^= 0x40;
  s3.put("ckpts", "c/blob-000000.bin", blob);
  const auto r = test::run_cli({"verify", "s3://ckpts/c"});
  EXPECT_EQ(r.exit_code, 4) << r.err;  // corrupt
  EXPECT_NE(r.err.find("checksum"), std::string::npos) << r.err;
}

TEST_F(S3Store, AnExistingCheckpointIsReplacedOnlyWhenAskedAndLeavesNoStaleBlobs) {
  const S3Client s3 = client();
  const S3Url url = parse_s3_url("s3://ckpts/d");
  const fs::path big = make_checkpoint("big", 6u << 20, 2u << 20, 1);
  upload_checkpoint(s3, big, url, false);
  ASSERT_GE(inspect(big).blob_count, 3u);
  EXPECT_EQ(code_of([&] { check_remote_output(s3, url, false); }), Errc::kExists);
  EXPECT_EQ(code_of([&] { check_remote_output(s3, url, true); }), Errc::kOk);

  const fs::path small = make_checkpoint("small", 1u << 20, 1ull << 30, 7);
  upload_checkpoint(s3, small, url, true);
  EXPECT_FALSE(s3.head("ckpts", "d/blob-000001.bin").has_value()) << "a stale blob is left";
  const fs::path back = dir_.path() / "back";
  fs::create_directories(back);
  download_checkpoint(s3, url, back);
  EXPECT_TRUE(test::same_contents(back / "manifest.json", small / "manifest.json"));
  EXPECT_EQ(verify(back).raw_bytes, inspect(small).raw_bytes);
}

TEST_F(S3Store, WrongCredentialsAndAGoneStoreAreClearErrors) {
  const fs::path ckpt = make_checkpoint("e", 1u << 20);
  ::setenv("AWS_ACCESS_KEY_ID", "NOBODY", 1);
  auto r = test::run_cli({"inspect", "s3://ckpts/e"});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("InvalidAccessKeyId"), std::string::npos) << r.err;
  server_->export_environment();
  server_->stop();
  r = test::run_cli({"verify", "s3://ckpts/e"});
  EXPECT_EQ(r.exit_code, 6) << r.err;  // io
  EXPECT_NE(r.err.find(server_->endpoint()), std::string::npos) << r.err;
}
