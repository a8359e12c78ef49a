#include "criu/stats.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "gpuckpt/error.h"
#include "util/fs.h"

namespace fs = std::filesystem;

namespace gpuckpt::criu {

namespace {

constexpr std::uint32_t kImgServiceMagic = 0x55105940;  // head magic of CRIU's service images
constexpr std::uint32_t kStatsMagic = 0x57093306;

[[noreturn]] void bad(const std::string& why) {
  throw Error(Errc::kCriu, "malformed CRIU stats image: " + why);
}

std::uint32_t u32_at(std::string_view s, std::size_t off) {
  if (off + 4 > s.size()) bad("truncated header");
  std::uint32_t v;
  std::memcpy(&v, s.data() + off, 4);  // CRIU writes host byte order (little-endian here)
  return v;
}

// Minimal protobuf wire-format reader: varints and length-delimited fields only.
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  bool done() const { return pos_ >= s_.size(); }
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= s_.size()) bad("truncated varint");
      const auto b = static_cast<std::uint8_t>(s_[pos_++]);
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    bad("overlong varint");
  }
  std::string_view bytes() {
    const auto n = varint();
    if (n > s_.size() - pos_) bad("truncated field");
    auto v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  void skip(unsigned wire_type) {
    switch (wire_type) {
      case 0:
        varint();
        break;
      case 1:
        advance(8);
        break;
      case 2:
        bytes();
        break;
      case 5:
        advance(4);
        break;
      default:
        bad("unsupported wire type " + std::to_string(wire_type));
    }
  }

 private:
  void advance(std::size_t n) {
    if (n > s_.size() - pos_) bad("truncated field");
    pos_ += n;
  }
  std::string_view s_;
  std::size_t pos_ = 0;
};

// Returns the sub-message `field` (1 = dump, 2 = restore) of the image's stats_entry.
std::string_view entry_field(std::string_view image, unsigned field) {
  if (u32_at(image, 0) != kImgServiceMagic) bad("not a CRIU service image");
  if (u32_at(image, 4) != kStatsMagic) bad("not a stats image");
  const std::uint32_t len = u32_at(image, 8);
  if (12 + static_cast<std::size_t>(len) > image.size()) bad("truncated entry");
  Reader r(image.substr(12, len));
  while (!r.done()) {
    const auto key = r.varint();
    if ((key >> 3) == field && (key & 7) == 2) return r.bytes();
    r.skip(key & 7);
  }
  bad(field == 1 ? "no dump entry" : "no restore entry");
}

std::optional<std::string> read_if_exists(const fs::path& p) {
  std::error_code ec;
  if (!fs::exists(p, ec)) return std::nullopt;
  return read_file(p);
}

// Calls f(field_number, value) for each varint field of a protobuf message; other wire types
// are skipped (the stats entries hold only varints that we read).
template <class F>
void for_each_varint(std::string_view message, F&& f) {
  Reader r(message);
  while (!r.done()) {
    const auto key = r.varint();
    if ((key & 7) != 0) {
      r.skip(key & 7);
      continue;
    }
    f(key >> 3, r.varint());
  }
}

}  // namespace

DumpStats decode_dump_stats(std::string_view image) {
  DumpStats s;
  for_each_varint(entry_field(image, 1), [&](std::uint64_t field, std::uint64_t v) {
    switch (field) {
      case 1:
        s.freezing_us = static_cast<std::uint32_t>(v);
        break;
      case 2:
        s.frozen_us = static_cast<std::uint32_t>(v);
        break;
      case 3:
        s.memdump_us = static_cast<std::uint32_t>(v);
        break;
      case 4:
        s.memwrite_us = static_cast<std::uint32_t>(v);
        break;
      case 5:
        s.pages_scanned = v;
        break;
      case 7:
        s.pages_written = v;
        break;
      default:
        break;
    }
  });
  return s;
}

RestoreStats decode_restore_stats(std::string_view image) {
  RestoreStats s;
  for_each_varint(entry_field(image, 2), [&](std::uint64_t field, std::uint64_t v) {
    switch (field) {
      case 3:
        s.forking_us = static_cast<std::uint32_t>(v);
        break;
      case 4:
        s.restore_us = static_cast<std::uint32_t>(v);
        break;
      case 5:
        s.pages_restored = v;
        break;
      default:
        break;
    }
  });
  return s;
}

std::optional<DumpStats> read_dump_stats(const fs::path& images_dir) {
  auto data = read_if_exists(images_dir / "stats-dump");
  if (!data) return std::nullopt;
  return decode_dump_stats(*data);
}

namespace {

// A process's start line is "(TIME)  PID: MARK N START..." (N > 0: it runs), its end line
// "(TIME)  PID: MARK DONE B bytes in S s"; the span runs from its start line's time for S seconds.
std::optional<LoggedSpan> parse_span(std::string_view log, std::string_view mark,
                                     std::string_view start_word, std::string_view done_word) {
  constexpr double kMaxSeconds = 1e7;  // CRIU's log clock never gets there: a garbled number
  // from_chars, unlike %llu, refuses a sign and a number that does not fit.
  auto number = [](std::string_view& v, auto& out) {
    const auto r = std::from_chars(v.data(), v.data() + v.size(), out);
    if (r.ec != std::errc()) return false;
    v.remove_prefix(static_cast<std::size_t>(r.ptr - v.data()));
    return true;
  };
  auto word = [](std::string_view& v, std::string_view w) {
    if (!v.starts_with(w)) return false;
    v.remove_prefix(w.size());
    return true;
  };
  std::map<int, double> started;
  std::set<int> ended;
  std::optional<LoggedSpan> f;
  for (std::size_t at = log.find(mark); at != std::string_view::npos; at = log.find(mark, at + 1)) {
    const std::size_t line = log.rfind('\n', at);
    const std::size_t begin = line == std::string_view::npos ? 0 : line + 1;
    const std::size_t eol = std::min(log.find('\n', at), log.size());
    const std::string head(log.substr(begin, at - begin));
    std::string_view rest = log.substr(at + mark.size(), eol - at - mark.size());
    double t = 0;
    int pid = 0;
    if (std::sscanf(head.c_str(), "(%lf) %d:", &t, &pid) != 2 || !(t >= 0 && t < kMaxSeconds))
      continue;
    unsigned threads = 0;
    if (std::string_view r = rest; number(r, threads) && word(r, start_word)) {
      if (threads > 0) started[pid] = t;
      continue;
    }
    if (!word(rest, done_word)) continue;
    double seconds = 0;
    std::uint64_t bytes = 0;
    const auto s = started.find(pid);
    // A line cut short, another format, or no start seen: no figure rather than a wrong one.
    if (s == started.end() || !number(rest, bytes) || !word(rest, " bytes in ") ||
        !number(rest, seconds) || rest != " s" || !(seconds >= 0 && seconds < kMaxSeconds))
      return std::nullopt;
    ended.insert(pid);
    const double start = s->second, end = start + seconds;
    if (!f) f = LoggedSpan{0, start, end};
    if (bytes > std::numeric_limits<std::uint64_t>::max() - f->bytes) return std::nullopt;
    f->bytes += bytes;
    f->start_s = std::min(f->start_s, start);
    f->end_s = std::max(f->end_s, end);
  }
  // A process whose span started and never ended: the total would leave it out.
  for (const auto& [pid, t] : started)
    if (!ended.contains(pid)) return std::nullopt;
  return f;
}

}  // namespace

std::optional<LoggedSpan> parse_fill_stats(std::string_view log) {
  //   "(00.090462)  22326: thp-fill: 1 populate threads over 512 chunks"
  //   "(08.550629)  22326: thp-fill: populate threads faulted in 4294967296 bytes in 8.453 s"
  // (the end comes once the read is done, later than the fill's end when the read is the
  // slower). A process whose helpers did not start logs "0 populate threads" and no end.
  return parse_span(log, "thp-fill: ", " populate threads over ", "populate threads faulted in ");
}

std::optional<LoggedSpan> parse_copy_stats(std::string_view log) {
  //   "(00.132946)  9118: copy: 2 streams over 537161728 bytes of pages-1.img, 1 helper threads"
  //   "(01.741115)  9118: copy: streams moved 537161728 bytes in 1.612 s"
  return parse_span(log, "copy: ", " streams over ", "streams moved ");
}

RestoreLogSpans read_restore_log_spans(const fs::path& restore_log) {
  // Figures for the report: a log that cannot be read must not fail a good restore.
  try {
    auto data = read_if_exists(restore_log);
    if (!data) return {};
    return {parse_fill_stats(*data), parse_copy_stats(*data)};
  } catch (const std::exception&) {
    return {};
  }
}

std::optional<RestoreStats> read_restore_stats(const fs::path& images_dir) {
  auto data = read_if_exists(images_dir / "stats-restore");
  if (!data) return std::nullopt;
  return decode_restore_stats(*data);
}

}  // namespace gpuckpt::criu
