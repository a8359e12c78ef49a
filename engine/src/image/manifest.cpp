#include "image/manifest.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <set>

#include "gpuckpt/error.h"
#include "gpuckpt/image.h"
#include "gpuckpt/support.h"
#include "image/aligned_buffer.h"
#include "image/chunk_codec.h"
#include "trust/keys.h"
#include "trust/secure_file.h"
#include "util/fs.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace gpuckpt {

const char* entry_type_name(EntryType t) {
  switch (t) {
    case EntryType::kFile:
      return "file";
    case EntryType::kDir:
      return "dir";
    case EntryType::kSymlink:
      return "symlink";
  }
  return "?";
}

}  // namespace gpuckpt

namespace gpuckpt::image {

namespace {

// Bounds a reader enforces before allocating anything from manifest values.
constexpr std::uint64_t kMaxChunkBytes = 256u << 20;
constexpr std::uint64_t kMinChunkBytes = 4096;

[[noreturn]] void corrupt(const std::string& origin, const std::string& what) {
  throw Error(Errc::kCorrupt, "checkpoint " + origin + ": manifest " + what);
}

const json& field(const json& o, const char* key, const std::string& where,
                  const std::string& origin) {
  auto it = o.find(key);
  if (it == o.end()) corrupt(origin, "lacks '" + where + key + "'");
  return *it;
}

std::uint64_t get_u64(const json& o, const char* key, const std::string& where,
                      const std::string& origin) {
  const json& v = field(o, key, where, origin);
  if (!v.is_number_unsigned())
    corrupt(origin, "field '" + where + key + "' is not an unsigned integer");
  return v.get<std::uint64_t>();
}

std::uint32_t get_u32(const json& o, const char* key, const std::string& where,
                      const std::string& origin) {
  const std::uint64_t v = get_u64(o, key, where, origin);
  if (v > UINT32_MAX) corrupt(origin, "field '" + where + key + "' is out of range");
  return static_cast<std::uint32_t>(v);
}

std::string get_str(const json& o, const char* key, const std::string& where,
                    const std::string& origin) {
  const json& v = field(o, key, where, origin);
  if (!v.is_string()) corrupt(origin, "field '" + where + key + "' is not a string");
  return v.get<std::string>();
}

std::uint64_t get_hash(const json& o, const char* key, const std::string& where,
                       const std::string& origin) {
  auto h = parse_hex64(get_str(o, key, where, origin));
  if (!h) corrupt(origin, "field '" + where + key + "' is not a 16-digit hex xxh3");
  return *h;
}

std::uint32_t parse_mode(const std::string& s, const std::string& where,
                         const std::string& origin) {
  if (s.empty() || s.size() > 5) corrupt(origin, "field '" + where + "mode' is not an octal mode");
  std::uint32_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '7') corrupt(origin, "field '" + where + "mode' is not an octal mode");
    v = v * 8 + static_cast<std::uint32_t>(c - '0');
  }
  if (v > 07777) corrupt(origin, "field '" + where + "mode' has bits beyond 07777");
  return v;
}

// Paths come from a file we did not necessarily write: they must stay inside the output.
bool safe_relative_path(const std::string& p) {
  if (p.empty() || p.front() == '/' || p.back() == '/') return false;
  if (p.find('\0') != std::string::npos) return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    const std::string_view comp(p.data() + start, end - start);
    if (comp.empty() || comp == "." || comp == "..") return false;
    start = end + 1;
  }
  return true;
}

bool safe_blob_name(const std::string& n) {
  return !n.empty() && n.find('/') == std::string::npos && n != "." && n != ".." &&
         n != kManifestName && n != kSealName && n.find('\0') == std::string::npos;
}

// A chunk record as read by the SAX reader: its fields and how each one looked, so that
// validation can report exactly what a JSON tree would have shown.
struct RawChunk {
  enum Field : std::uint8_t { kBlob, kOffset, kStored, kRaw, kXxh3, kCodec, kBlake2b, kFields };
  enum State : std::uint8_t { kMissing, kOk, kWrongType, kBadValue };
  std::uint64_t num[4] = {};  // blob, offset, stored, raw
  std::uint64_t hash = 0;
  Codec codec = Codec::kRaw;
  std::array<unsigned char, 32> digest{};
  State state[kFields] = {};
  bool not_object = false;
};

const char* const kChunkFieldNames[] = {"blob", "offset", "stored", "raw",
                                        "xxh3", "codec",  "blake2b"};

int chunk_field(const std::string& key) {
  const auto& names = kChunkFieldNames;
  for (int i = 0; i < RawChunk::kFields; ++i)
    if (key == names[i]) return i;
  return -1;
}

// SAX handler that builds the JSON tree of the manifest, except for the chunk arrays of
// top-level entries: those are read straight into RawChunk records (the tree gets an empty
// array in their place). A JSON tree costs ~1 KiB per chunk record, and a manifest may list
// millions of them, most of all one written to exhaust the reader.
class ManifestSax : public json::json_sax_t {
 public:
  json root;
  std::vector<std::vector<RawChunk>> chunks;  // per element of the top-level "entries"
  std::string error;

  bool null() override { return scalar(nullptr); }
  bool boolean(bool v) override { return scalar(v); }
  bool number_integer(number_integer_t v) override { return scalar(v); }
  bool number_unsigned(number_unsigned_t v) override { return scalar(v); }
  bool number_float(number_float_t v, const string_t&) override { return scalar(v); }
  bool string(string_t& v) override { return scalar(std::move(v)); }
  bool binary(binary_t&) override {  // CBOR and friends only; JSON text has none
    error = "binary value";
    return false;
  }

  bool start_object(std::size_t) override {
    if (collecting_) return collect_open(true);
    note_element();
    stack_.push_back(put(json::object()));
    return true;
  }
  bool end_object() override {
    if (collecting_) return collect_close();
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (collecting_) return collect_open(false);
    if (expect_chunks_ && stack_.size() == 3 && entries_open_) {
      // entries[i].chunks: collected, not built.
      put(json::array());
      chunks.back().clear();  // a repeated key replaces, as it does in a tree
      collecting_ = true;
      expect_chunks_ = false;
      return true;
    }
    const bool is_entries = expect_entries_ && stack_.size() == 1;
    note_element();
    stack_.push_back(put(json::array()));
    if (is_entries) {
      entries_open_ = true;
      chunks.clear();
    }
    return true;
  }
  bool end_array() override {
    if (collecting_) return collect_close();
    stack_.pop_back();
    if (stack_.size() == 1) entries_open_ = false;
    return true;
  }
  bool key(string_t& k) override {
    if (collecting_) {
      if (skip_ == 0) field_ = chunk_field(k);
      return true;
    }
    expect_entries_ = stack_.size() == 1 && k == "entries";
    expect_chunks_ = stack_.size() == 3 && entries_open_ && k == "chunks";
    slot_ = &(*stack_.back())[k];
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();
    return false;
  }

 private:
  // A value arrives: into the open array, or into the slot of the last key.
  template <class V>
  json* put(V&& v) {
    if (stack_.empty()) {
      root = json(std::forward<V>(v));
      return &root;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.emplace_back(std::forward<V>(v));
      return &top.back();
    }
    *slot_ = json(std::forward<V>(v));
    return slot_;
  }

  // Keeps `chunks` indexed like the elements of the top-level entries array.
  void note_element() {
    if (entries_open_ && stack_.size() == 2) chunks.emplace_back();
    expect_entries_ = expect_chunks_ = false;
  }

  template <class V>
  bool scalar(V&& v) {
    if (collecting_) return collect_scalar(json(std::forward<V>(v)));
    note_element();
    put(std::forward<V>(v));
    return true;
  }

  bool collect_open(bool object) {
    auto& out = chunks.back();
    if (skip_ > 0) {
      ++skip_;
    } else if (!in_chunk_) {
      out.emplace_back();
      if (object) {
        in_chunk_ = true;
        field_ = -1;
      } else {
        out.back().not_object = true;
        skip_ = 1;
      }
    } else {
      if (field_ >= 0) out.back().state[field_] = RawChunk::kWrongType;
      skip_ = 1;
    }
    return true;
  }

  bool collect_close() {
    if (skip_ > 0)
      --skip_;
    else if (in_chunk_)
      in_chunk_ = false;
    else
      collecting_ = false;  // the end of the chunks array
    return true;
  }

  bool collect_scalar(const json& v) {
    if (skip_ > 0) return true;
    auto& out = chunks.back();
    if (!in_chunk_) {
      out.emplace_back().not_object = true;
      return true;
    }
    if (field_ < 0) return true;
    RawChunk& c = out.back();
    auto& st = c.state[field_];
    if (field_ <= RawChunk::kRaw) {
      st = v.is_number_unsigned() ? RawChunk::kOk : RawChunk::kWrongType;
      if (st == RawChunk::kOk) c.num[field_] = v.get<std::uint64_t>();
    } else if (!v.is_string()) {
      st = RawChunk::kWrongType;
    } else if (field_ == RawChunk::kXxh3) {
      const auto h = parse_hex64(v.get_ref<const std::string&>());
      st = h ? RawChunk::kOk : RawChunk::kBadValue;
      if (h) c.hash = *h;
    } else if (field_ == RawChunk::kBlake2b) {
      const auto d = parse_digest(v.get_ref<const std::string&>());
      st = d ? RawChunk::kOk : RawChunk::kBadValue;
      if (d) c.digest = *d;
    } else {
      const auto& name = v.get_ref<const std::string&>();
      st = name == "zstd" || name == "raw" ? RawChunk::kOk : RawChunk::kBadValue;
      c.codec = name == "zstd" ? Codec::kZstd : Codec::kRaw;
    }
    return true;
  }

  std::vector<json*> stack_;
  json* slot_ = nullptr;
  bool expect_entries_ = false, entries_open_ = false, expect_chunks_ = false;
  bool collecting_ = false, in_chunk_ = false;
  int skip_ = 0;  // depth inside a container where a chunk field or record should be
  int field_ = -1;
};

ChunkRecord check_chunk(const RawChunk& r, const std::string& cw, const std::string& origin) {
  if (r.not_object) corrupt(origin, "field '" + cw + "' is not an object");
  for (int f = 0; f < RawChunk::kFields; ++f) {
    const std::string name = cw + kChunkFieldNames[f];
    switch (r.state[f]) {
      case RawChunk::kMissing:
        if (f == RawChunk::kBlake2b) break;  // optional: signed checkpoints have it
        corrupt(origin, "lacks '" + name + "'");
      case RawChunk::kWrongType:
        corrupt(origin, "field '" + name + "' is not " +
                            (f <= RawChunk::kRaw ? "an unsigned integer" : "a string"));
      case RawChunk::kBadValue:
        corrupt(origin, "field '" + name + "' " +
                            (f == RawChunk::kXxh3      ? "is not a 16-digit hex xxh3"
                             : f == RawChunk::kBlake2b ? "is not a 64-digit hex blake2b"
                                                       : "names an unknown codec"));
      case RawChunk::kOk:
        break;
    }
    if ((f == RawChunk::kBlob || f == RawChunk::kStored || f == RawChunk::kRaw) &&
        r.num[f] > UINT32_MAX)
      corrupt(origin, "field '" + name + "' is out of range");
  }
  ChunkRecord c;
  c.blob = static_cast<std::uint32_t>(r.num[RawChunk::kBlob]);
  c.offset = r.num[RawChunk::kOffset];
  c.stored = static_cast<std::uint32_t>(r.num[RawChunk::kStored]);
  c.raw = static_cast<std::uint32_t>(r.num[RawChunk::kRaw]);
  c.xxh3 = r.hash;
  c.codec = r.codec;
  c.has_blake2b = r.state[RawChunk::kBlake2b] == RawChunk::kOk;
  c.blake2b = r.digest;
  return c;
}

// Chunks may not share bytes: then reading every chunk costs at most the blobs' size, however
// many records a manifest lists.
void check_no_overlap(const Manifest& m, const std::string& origin) {
  struct Span {
    std::uint64_t offset, end;
    std::uint32_t blob, entry, chunk;
  };
  std::vector<Span> spans;
  spans.reserve(m.chunk_count());
  for (std::uint32_t i = 0; i < m.entries.size(); ++i)
    for (std::uint32_t k = 0; k < m.entries[i].chunks.size(); ++k) {
      const ChunkRecord& c = m.entries[i].chunks[k];
      spans.push_back({c.offset, c.offset + c.stored, c.blob, i, k});
    }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.blob != b.blob ? a.blob < b.blob : a.offset < b.offset;
  });
  for (std::size_t i = 1; i < spans.size(); ++i) {
    const Span &a = spans[i - 1], &b = spans[i];
    if (a.blob == b.blob && b.offset < a.end) {
      auto name = [](const Span& s) {
        return "entries[" + std::to_string(s.entry) + "].chunks[" + std::to_string(s.chunk) + "]";
      };
      corrupt(origin, "chunk '" + name(b) + "' overlaps chunk '" + name(a) + "' in blob " +
                          m.blobs[a.blob].name);
    }
  }
}

// The document as a tree, its entries' chunk records left in `sax`. Only a gpuckpt manifest
// gets past this point: another JSON file is reported as such, not by its first missing field.
const json& parse_document(std::string_view text, const std::string& origin, ManifestSax& sax) {
  if (!json::sax_parse(text.begin(), text.end(), &sax))
    corrupt(origin, "is not valid JSON (" + sax.error + ")");
  const json& doc = sax.root;
  if (!doc.is_object()) corrupt(origin, "is not a JSON object");
  auto fmt = doc.find("format");
  if (fmt == doc.end() || !fmt->is_string() || fmt->get<std::string>() != kFormatName)
    corrupt(origin, std::string("is not a ") + kFormatName + " manifest (\"format\" field)");
  return doc;
}

// An unknown major is a newer writer, not damage: kVersion lets callers say so.
std::uint32_t parse_major(const json& doc, const std::string& origin) {
  const std::uint32_t major = get_u32(doc, "format_version", "", origin);
  if (major != kImageFormatMajor) {
    throw Error(Errc::kVersion, "checkpoint " + origin + ": format version " +
                                    std::to_string(major) + " is not supported (this gpuckpt " +
                                    "reads version " + std::to_string(kImageFormatMajor) + ")");
  }
  return major;
}

int parse_zstd_level(const json& doc, const std::string& origin) {
  const json& comp = field(doc, "compression", "", origin);
  if (!comp.is_object()) corrupt(origin, "field 'compression' is not an object");
  if (get_str(comp, "codec", "compression.", origin) != "zstd")
    corrupt(origin, "field 'compression.codec' names an unknown codec");
  const json& lvl = field(comp, "level", "compression.", origin);
  if (!lvl.is_number_integer()) corrupt(origin, "field 'compression.level' is not an integer");
  return lvl.get<int>();
}

// The fields before the blobs: version, provenance, chunking and codecs.
void parse_header(const json& doc, const std::string& origin, Manifest& m) {
  m.major = parse_major(doc, origin);
  // Minor versions only add fields; unknown ones are ignored.
  m.minor = doc.contains("format_minor") ? get_u32(doc, "format_minor", "", origin) : 0;
  m.created_by = get_str(doc, "created_by", "", origin);
  m.created_at = get_str(doc, "created_at", "", origin);
  if (doc.contains("host")) m.host = get_str(doc, "host", "", origin);
  if (doc.contains("source")) m.source = get_str(doc, "source", "", origin);
  m.input_kind = get_str(doc, "input_kind", "", origin);
  if (m.input_kind != "directory" && m.input_kind != "file")
    corrupt(origin, "field 'input_kind' must be \"directory\" or \"file\"");
  m.chunk_bytes = get_u32(doc, "chunk_bytes", "", origin);
  if (m.chunk_bytes < kMinChunkBytes || m.chunk_bytes > kMaxChunkBytes)
    corrupt(origin, "field 'chunk_bytes' is out of range");
  m.zstd_level = parse_zstd_level(doc, origin);
  if (get_str(doc, "checksum", "", origin) != "xxh3-64")
    corrupt(origin, "field 'checksum' names an unknown checksum");
}

std::vector<BlobRecord> parse_blobs(const json& doc, const std::string& origin) {
  const json& blobs = field(doc, "blobs", "", origin);
  if (!blobs.is_array()) corrupt(origin, "field 'blobs' is not an array");
  std::vector<BlobRecord> out;
  std::set<std::string> names;
  for (size_t i = 0; i < blobs.size(); ++i) {
    const std::string where = "blobs[" + std::to_string(i) + "].";
    if (!blobs[i].is_object()) corrupt(origin, "field '" + where + "' is not an object");
    BlobRecord b{get_str(blobs[i], "name", where, origin),
                 get_u64(blobs[i], "size", where, origin)};
    if (!safe_blob_name(b.name) || !names.insert(b.name).second)
      corrupt(origin, "field '" + where + "name' is not a unique plain file name");
    out.push_back(std::move(b));
  }
  return out;
}

// Records `path` in `seen`; `dirs` holds the directories listed before it.
void check_entry_path(const std::string& path, std::set<std::string>& seen,
                      const std::set<std::string>& dirs, const std::string& origin) {
  if (!safe_relative_path(path))
    corrupt(origin, "entry path '" + path + "' is not a safe relative path");
  // Unpacked, it would mark the output as a temporary that any later run's sweep removes.
  if (path == kTempMarker)
    corrupt(origin, "lists '" + path + "', the name of gpuckpt's temporary marker");
  if (!seen.insert(path).second) corrupt(origin, "lists '" + path + "' twice");
  // A parent must be a directory listed earlier: nothing can be created through a symlink.
  const auto slash = path.rfind('/');
  if (slash != std::string::npos && !dirs.count(path.substr(0, slash)))
    corrupt(origin, "entry '" + path + "' comes before (or without) its parent directory");
}

// The chunk's sizes and place in its blob; `cw` names it in messages ("entries[i].chunks[k].").
void check_chunk_layout(const ChunkRecord& c, const std::string& cw, bool last, const Manifest& m,
                        const std::string& origin) {
  const std::string cname = cw.substr(0, cw.size() - 1);
  if (c.blob >= m.blobs.size()) corrupt(origin, "field '" + cw + "blob' is out of range");
  if (c.raw == 0 || c.raw > m.chunk_bytes || c.stored == 0 || c.stored > c.raw ||
      (c.codec == Codec::kRaw && c.stored != c.raw))
    corrupt(origin, "chunk '" + cname + "' has inconsistent sizes");
  if (!last && c.raw != m.chunk_bytes)
    corrupt(origin, "chunk '" + cname + "' is short but not the last of its file");
  if (c.offset > m.blobs[c.blob].size || m.blobs[c.blob].size - c.offset < c.stored)
    corrupt(origin, "chunk '" + cname + "' lies outside its blob");
}

std::vector<ChunkRecord> parse_chunks(const std::vector<RawChunk>& raw, const std::string& where,
                                      const Manifest& m, const std::string& origin) {
  std::vector<ChunkRecord> out;
  out.reserve(raw.size());
  for (size_t k = 0; k < raw.size(); ++k) {
    const std::string cw = where + "chunks[" + std::to_string(k) + "].";
    const ChunkRecord c = check_chunk(raw[k], cw, origin);
    check_chunk_layout(c, cw, k + 1 == raw.size(), m, origin);
    out.push_back(c);
  }
  return out;
}

// `collected`: the chunk records the reader took out of this entry's "chunks" array.
void parse_file(const json& j, const std::string& where, std::vector<RawChunk>& collected,
                const Manifest& m, const std::string& origin, ManifestEntry& e) {
  e.size = get_u64(j, "size", where, origin);
  e.xxh3 = get_hash(j, "xxh3", where, origin);
  const json& chunks = field(j, "chunks", where, origin);
  if (!chunks.is_array()) corrupt(origin, "field '" + where + "chunks' is not an array");
  // The tree holds an empty array where the reader collected the records.
  std::vector<RawChunk> raw;
  if (chunks.empty()) raw.swap(collected);
  e.chunks = parse_chunks(raw, where, m, origin);
  std::uint64_t total = 0;
  for (const ChunkRecord& c : e.chunks) total += c.raw;
  if (total != e.size)
    corrupt(origin, "file '" + e.path + "': chunk sizes do not add up to its size");
}

// The fields after the path: type, mode and what that type carries.
void parse_entry_body(const json& j, const std::string& where, std::vector<RawChunk>& collected,
                      const Manifest& m, const std::string& origin, ManifestEntry& e) {
  const std::string type = get_str(j, "type", where, origin);
  e.mode = parse_mode(get_str(j, "mode", where, origin), where, origin);
  if (type == "dir") {
    e.type = EntryType::kDir;
  } else if (type == "symlink") {
    e.type = EntryType::kSymlink;
    e.target = get_str(j, "target", where, origin);
    if (e.target.empty() || e.target.find('\0') != std::string::npos)
      corrupt(origin, "symlink '" + e.path + "' has an invalid target");
  } else if (type == "file") {
    e.type = EntryType::kFile;
    parse_file(j, where, collected, m, origin, e);
  } else {
    corrupt(origin, "entry '" + e.path + "' has unknown type '" + type + "'");
  }
}

// Fills m.entries; the blobs and chunk size must already be in `m`. `collected` holds the
// chunk records of each element of "entries", as the reader found them.
void parse_entries(const json& doc, std::vector<std::vector<RawChunk>>& collected,
                   const std::string& origin, Manifest& m) {
  const json& entries = field(doc, "entries", "", origin);
  if (!entries.is_array()) corrupt(origin, "field 'entries' is not an array");
  std::set<std::string> seen, dirs;
  std::vector<RawChunk> none;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string where = "entries[" + std::to_string(i) + "].";
    const json& j = entries[i];
    if (!j.is_object()) corrupt(origin, "field '" + where + "' is not an object");
    ManifestEntry e;
    e.path = get_str(j, "path", where, origin);
    check_entry_path(e.path, seen, dirs, origin);
    parse_entry_body(j, where, i < collected.size() ? collected[i] : none, m, origin, e);
    if (e.type == EntryType::kDir) dirs.insert(e.path);
    m.entries.push_back(std::move(e));
  }
}

void check_single_file(const Manifest& m, const std::string& origin) {
  if (m.input_kind == "file" && (m.entries.size() != 1 || m.entries[0].type != EntryType::kFile ||
                                 m.entries[0].path.find('/') != std::string::npos))
    corrupt(origin, "of a single-file checkpoint must list exactly one file");
}

void check_totals(const json& doc, const Manifest& m, const std::string& origin) {
  if (get_u64(doc, "raw_bytes", "", origin) != m.raw_bytes() ||
      get_u64(doc, "stored_bytes", "", origin) != m.stored_bytes() ||
      get_u64(doc, "chunk_count", "", origin) != m.chunk_count())
    corrupt(origin, "totals do not match its entries");
}

// Null when the manifest has no "extra".
json parse_extra(const json& doc, const std::string& origin) {
  const auto it = doc.find("extra");
  if (it == doc.end()) return json();
  if (!it->is_object()) corrupt(origin, "field 'extra' is not an object");
  return *it;
}

}  // namespace

std::uint64_t ManifestEntry::stored_bytes() const {
  std::uint64_t s = 0;
  for (const auto& c : chunks) s += c.stored;
  return s;
}

std::uint64_t Manifest::raw_bytes() const {
  std::uint64_t s = 0;
  for (const auto& e : entries) s += e.size;
  return s;
}
std::uint64_t Manifest::stored_bytes() const {
  std::uint64_t s = 0;
  for (const auto& e : entries) s += e.stored_bytes();
  return s;
}
std::uint64_t Manifest::chunk_count() const {
  std::uint64_t s = 0;
  for (const auto& e : entries) s += e.chunks.size();
  return s;
}

std::string blob_name(std::uint32_t index) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "blob-%06u.bin", index);
  return buf;
}

std::string serialize(const Manifest& m) {
  json blobs = json::array();
  for (const auto& b : m.blobs) blobs.push_back({{"name", b.name}, {"size", b.size}});
  json entries = json::array();
  for (const auto& e : m.entries) {
    json j = {{"path", e.path}, {"type", entry_type_name(e.type)}, {"mode", format_mode(e.mode)}};
    if (e.type == EntryType::kFile) {
      j["size"] = e.size;
      j["xxh3"] = format_hex64(e.xxh3);
      json chunks = json::array();
      for (const auto& c : e.chunks) {
        chunks.push_back({{"blob", c.blob},
                          {"offset", c.offset},
                          {"stored", c.stored},
                          {"raw", c.raw},
                          {"codec", c.codec == Codec::kZstd ? "zstd" : "raw"},
                          {"xxh3", format_hex64(c.xxh3)}});
        if (c.has_blake2b) chunks.back()["blake2b"] = hex(c.blake2b);
      }
      j["chunks"] = std::move(chunks);
    } else if (e.type == EntryType::kSymlink) {
      j["target"] = e.target;
    }
    entries.push_back(std::move(j));
  }
  json doc = {{"format", kFormatName},
              {"format_version", m.major},
              {"format_minor", m.minor},
              {"created_by", m.created_by},
              {"created_at", m.created_at},
              {"host", m.host},
              {"source", m.source},
              {"input_kind", m.input_kind},
              {"chunk_bytes", m.chunk_bytes},
              {"chunk_alignment", kIoAlign},
              {"compression", {{"codec", "zstd"}, {"level", m.zstd_level}}},
              {"checksum", "xxh3-64"},
              {"raw_bytes", m.raw_bytes()},
              {"stored_bytes", m.stored_bytes()},
              {"chunk_count", m.chunk_count()},
              {"blobs", std::move(blobs)},
              {"entries", std::move(entries)}};
  if (!m.extra.is_null()) doc["extra"] = m.extra;
  // One entry per line would be nicer to diff, but indent=1 keeps multi-GiB manifests small.
  // Entries' names are UTF-8 (scan_input refuses others); what else is not (a process's name,
  // its command line, an input's path) is only described, and comes back with U+FFFD in it.
  return doc.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
}

Manifest parse_manifest(std::string_view text, const std::string& origin) {
  ManifestSax sax;
  const json& doc = parse_document(text, origin, sax);
  Manifest m;
  parse_header(doc, origin, m);
  m.blobs = parse_blobs(doc, origin);
  parse_entries(doc, sax.chunks, origin, m);
  check_single_file(m, origin);
  check_totals(doc, m, origin);
  m.extra = parse_extra(doc, origin);
  check_no_overlap(m, origin);
  return m;
}

std::string make_seal(std::string_view manifest, const trust::SigningKey* key) {
  json seal = {{"format", kSealFormatName},
               {"version", 1},
               {"manifest_bytes", manifest.size()},
               {"manifest_xxh3", format_hex64(xxh3(manifest.data(), manifest.size()))}};
  if (key) {
    const trust::Signature sig = key->sign(manifest);
    seal["signature"] = {{"algorithm", trust::kAlgorithm},
                         {"key_id", trust::key_id(key->public_key())},
                         {"public_key", trust::to_base64(key->public_key().data(), 32)},
                         {"value", trust::to_base64(sig.data(), sig.size())}};
  }
  return seal.dump(1) + "\n";
}

namespace {

// What the seal says about `manifest`; sets `problem` (and returns false) when the seal is
// not one this reader understands.
bool check_seal(const std::string& seal_text, std::string_view manifest, const std::string& origin,
                SignatureInfo& sig, std::string& problem) {
  const json seal = json::parse(seal_text, nullptr, false);
  const auto fmt = seal.is_object() ? seal.find("format") : seal.end();
  if (!seal.is_object() || fmt == seal.end() || *fmt != kSealFormatName ||
      !seal.contains("version") || !seal["version"].is_number_unsigned()) {
    problem = "is not a gpuckpt seal";
    return false;
  }
  if (seal["version"] != 1) {
    problem = "has version " + seal["version"].dump() + " (this gpuckpt reads version 1)";
    return false;
  }
  const auto size = seal.find("manifest_bytes");
  const auto hash = seal.find("manifest_xxh3");
  std::optional<std::uint64_t> h;
  if (hash != seal.end() && hash->is_string()) h = parse_hex64(hash->get<std::string>());
  if (size == seal.end() || !size->is_number_unsigned() || !h) {
    problem = "lacks a valid 'manifest_bytes' or 'manifest_xxh3'";
    return false;
  }
  if (size->get<std::uint64_t>() != manifest.size() || *h != xxh3(manifest.data(), manifest.size()))
    throw Error(Errc::kCorrupt, "checkpoint " + origin + ": " + kManifestName +
                                    " does not match its checksum in " + kSealName +
                                    " (the manifest was changed or damaged)");
  const auto s = seal.find("signature");
  if (s == seal.end()) return true;
  sig.state = SignatureState::kInvalid;
  if (!s->is_object()) {
    sig.problem = "the signature is not an object";
    return true;
  }
  auto str = [&](const char* k) {
    auto it = s->find(k);
    return it != s->end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  sig.key_id = str("key_id");
  sig.public_key = str("public_key");
  if (str("algorithm") != trust::kAlgorithm) {
    sig.problem = "unknown signature algorithm '" + str("algorithm") + "'";
    return true;
  }
  const auto pk = trust::from_base64(sig.public_key, 32);
  const auto value = trust::from_base64(str("value"), 64);
  if (!pk || !value) {
    sig.problem = "the signature's public key or value is not valid base64 of the right length";
    return true;
  }
  trust::PublicKey key;
  trust::Signature sv;
  std::copy(pk->begin(), pk->end(), key.begin());
  std::copy(value->begin(), value->end(), sv.begin());
  if (trust::key_id(key) != sig.key_id) {
    sig.problem = "the key id does not match the signature's public key";
    return true;
  }
  if (!trust::verify(key, sv, manifest)) {
    sig.problem = "the signature does not match the manifest";
    return true;
  }
  sig.state = SignatureState::kValid;
  return true;
}

}  // namespace

Manifest load_manifest(const fs::path& checkpoint) {
  std::error_code ec;
  const auto st = fs::status(checkpoint, ec);
  if (!fs::exists(st))
    throw Error(Errc::kInvalidInput, "checkpoint " + checkpoint.string() + " does not exist");
  if (!fs::is_directory(st))
    throw Error(Errc::kInvalidInput, "checkpoint " + checkpoint.string() +
                                         " is not a directory (a checkpoint is a " +
                                         "directory holding " + kManifestName + " and blobs)");
  const std::string origin = checkpoint.string();
  // Only regular files are read: a FIFO would block, a symlink may point at /dev/zero.
  const auto text = trust::read_regular_file(checkpoint / kManifestName,
                                             "checkpoint " + origin + ": " + kManifestName,
                                             {kMaxManifestBytes, Errc::kCorrupt, false});
  if (!text) {
    // Blobs without a manifest: a damaged checkpoint; nothing at all: not a checkpoint.
    if (fs::exists(fs::symlink_status(checkpoint / blob_name(0), ec)))
      throw Error(Errc::kCorrupt,
                  "checkpoint " + origin + " is damaged: " + kManifestName + " is missing");
    throw Error(Errc::kInvalidInput,
                origin + " is not a gpuckpt checkpoint (no " + kManifestName + ")");
  }
  const auto seal =
      trust::read_regular_file(checkpoint / kSealName, "checkpoint " + origin + ": " + kSealName,
                               {kMaxSealBytes, Errc::kCorrupt, false});
  // The checksum is checked before the parser sees a byte of the manifest.
  SignatureInfo sig;
  std::string seal_problem;
  const bool sealed = seal && check_seal(*seal, *text, origin, sig, seal_problem);
  Manifest m = parse_manifest(*text, origin);  // kVersion for a major we do not know
  if (seal && !sealed)
    throw Error(Errc::kCorrupt, "checkpoint " + origin + ": " + kSealName + " " + seal_problem);
  if (!seal && m.minor >= 1)
    throw Error(Errc::kCorrupt, "checkpoint " + origin + " is damaged: " + kSealName +
                                    " is missing (format 1." + std::to_string(m.minor) +
                                    " manifests are sealed)");
  // The signature vouches for the blobs only through digests nobody can match with other data.
  const auto undigested = std::find_if(m.entries.begin(), m.entries.end(), [](const auto& e) {
    return std::any_of(e.chunks.begin(), e.chunks.end(),
                       [](const ChunkRecord& c) { return !c.has_blake2b; });
  });
  if (sig.state == SignatureState::kValid && undigested != m.entries.end()) {
    sig.state = SignatureState::kInvalid;
    sig.problem = "the signed manifest lacks the blake2b digest of a chunk of '" +
                  undigested->path + "', so the signature does not cover its data";
  }
  m.sealed = sealed;
  m.signature = std::move(sig);
  return m;
}

}  // namespace gpuckpt::image
