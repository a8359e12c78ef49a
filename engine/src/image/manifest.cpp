#include "image/manifest.h"

#include <sys/stat.h>

#include <cstdio>
#include <set>

#include "gpuckpt/error.h"
#include "gpuckpt/image.h"
#include "image/aligned_buffer.h"
#include "image/chunk_codec.h"
#include "util/fs.h"

namespace fs = std::filesystem;
using nlohmann::json;

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

std::string mode_string(std::uint32_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", mode);
  return buf;
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
         n != kManifestName && n.find('\0') == std::string::npos;
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

std::string serialize(const Manifest& m) {
  json blobs = json::array();
  for (const auto& b : m.blobs) blobs.push_back({{"name", b.name}, {"size", b.size}});
  json entries = json::array();
  for (const auto& e : m.entries) {
    json j = {{"path", e.path}, {"type", entry_type_name(e.type)}, {"mode", mode_string(e.mode)}};
    if (e.type == EntryType::kFile) {
      j["size"] = e.size;
      j["xxh3"] = hex64(e.xxh3);
      json chunks = json::array();
      for (const auto& c : e.chunks) {
        chunks.push_back({{"blob", c.blob},
                          {"offset", c.offset},
                          {"stored", c.stored},
                          {"raw", c.raw},
                          {"codec", c.codec == Codec::kZstd ? "zstd" : "raw"},
                          {"xxh3", hex64(c.xxh3)}});
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
  return doc.dump(1) + "\n";
}

Manifest parse_manifest(std::string_view text, const std::string& origin) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    corrupt(origin, std::string("is not valid JSON (") + e.what() + ")");
  }
  if (!doc.is_object()) corrupt(origin, "is not a JSON object");
  auto fmt = doc.find("format");
  if (fmt == doc.end() || !fmt->is_string() || fmt->get<std::string>() != kFormatName)
    corrupt(origin, std::string("is not a ") + kFormatName + " manifest (\"format\" field)");

  Manifest m;
  m.major = get_u32(doc, "format_version", "", origin);
  if (m.major != kImageFormatMajor) {
    throw Error(Errc::kVersion, "checkpoint " + origin + ": format version " +
                                    std::to_string(m.major) + " is not supported (this gpuckpt " +
                                    "reads version " + std::to_string(kImageFormatMajor) + ")");
  }
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
  const json& comp = field(doc, "compression", "", origin);
  if (!comp.is_object()) corrupt(origin, "field 'compression' is not an object");
  if (get_str(comp, "codec", "compression.", origin) != "zstd")
    corrupt(origin, "field 'compression.codec' names an unknown codec");
  const json& lvl = field(comp, "level", "compression.", origin);
  if (!lvl.is_number_integer()) corrupt(origin, "field 'compression.level' is not an integer");
  m.zstd_level = lvl.get<int>();
  if (get_str(doc, "checksum", "", origin) != "xxh3-64")
    corrupt(origin, "field 'checksum' names an unknown checksum");

  const json& blobs = field(doc, "blobs", "", origin);
  if (!blobs.is_array()) corrupt(origin, "field 'blobs' is not an array");
  std::set<std::string> blob_names;
  for (size_t i = 0; i < blobs.size(); ++i) {
    const std::string where = "blobs[" + std::to_string(i) + "].";
    if (!blobs[i].is_object()) corrupt(origin, "field '" + where + "' is not an object");
    BlobRecord b{get_str(blobs[i], "name", where, origin),
                 get_u64(blobs[i], "size", where, origin)};
    if (!safe_blob_name(b.name) || !blob_names.insert(b.name).second)
      corrupt(origin, "field '" + where + "name' is not a unique plain file name");
    m.blobs.push_back(std::move(b));
  }

  const json& entries = field(doc, "entries", "", origin);
  if (!entries.is_array()) corrupt(origin, "field 'entries' is not an array");
  std::set<std::string> seen, dirs;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string where = "entries[" + std::to_string(i) + "].";
    const json& j = entries[i];
    if (!j.is_object()) corrupt(origin, "field '" + where + "' is not an object");
    ManifestEntry e;
    e.path = get_str(j, "path", where, origin);
    if (!safe_relative_path(e.path))
      corrupt(origin, "entry path '" + e.path + "' is not a safe relative path");
    if (!seen.insert(e.path).second) corrupt(origin, "lists '" + e.path + "' twice");
    // A parent must be a directory listed earlier: nothing can be created through a symlink.
    const auto slash = e.path.rfind('/');
    if (slash != std::string::npos && !dirs.count(e.path.substr(0, slash)))
      corrupt(origin, "entry '" + e.path + "' comes before (or without) its parent directory");
    const std::string type = get_str(j, "type", where, origin);
    e.mode = parse_mode(get_str(j, "mode", where, origin), where, origin);
    if (type == "dir") {
      e.type = EntryType::kDir;
      dirs.insert(e.path);
    } else if (type == "symlink") {
      e.type = EntryType::kSymlink;
      e.target = get_str(j, "target", where, origin);
      if (e.target.empty() || e.target.find('\0') != std::string::npos)
        corrupt(origin, "symlink '" + e.path + "' has an invalid target");
    } else if (type == "file") {
      e.type = EntryType::kFile;
      e.size = get_u64(j, "size", where, origin);
      e.xxh3 = get_hash(j, "xxh3", where, origin);
      const json& chunks = field(j, "chunks", where, origin);
      if (!chunks.is_array()) corrupt(origin, "field '" + where + "chunks' is not an array");
      std::uint64_t total = 0;
      for (size_t k = 0; k < chunks.size(); ++k) {
        const std::string cw = where + "chunks[" + std::to_string(k) + "].";
        const std::string cname = cw.substr(0, cw.size() - 1);
        const json& cj = chunks[k];
        if (!cj.is_object()) corrupt(origin, "field '" + cw + "' is not an object");
        ChunkRecord c;
        c.blob = get_u32(cj, "blob", cw, origin);
        c.offset = get_u64(cj, "offset", cw, origin);
        c.stored = get_u32(cj, "stored", cw, origin);
        c.raw = get_u32(cj, "raw", cw, origin);
        c.xxh3 = get_hash(cj, "xxh3", cw, origin);
        const std::string codec = get_str(cj, "codec", cw, origin);
        if (codec == "zstd")
          c.codec = Codec::kZstd;
        else if (codec == "raw")
          c.codec = Codec::kRaw;
        else
          corrupt(origin, "field '" + cw + "codec' names an unknown codec");
        if (c.blob >= m.blobs.size()) corrupt(origin, "field '" + cw + "blob' is out of range");
        if (c.raw == 0 || c.raw > m.chunk_bytes || c.stored == 0 || c.stored > c.raw ||
            (c.codec == Codec::kRaw && c.stored != c.raw))
          corrupt(origin, "chunk '" + cname + "' has inconsistent sizes");
        if (k + 1 < chunks.size() && c.raw != m.chunk_bytes)
          corrupt(origin, "chunk '" + cname + "' is short but not the last of its file");
        if (c.offset > m.blobs[c.blob].size || m.blobs[c.blob].size - c.offset < c.stored)
          corrupt(origin, "chunk '" + cname + "' lies outside its blob");
        total += c.raw;
        e.chunks.push_back(c);
      }
      if (total != e.size)
        corrupt(origin, "file '" + e.path + "': chunk sizes do not add up to its size");
    } else {
      corrupt(origin, "entry '" + e.path + "' has unknown type '" + type + "'");
    }
    m.entries.push_back(std::move(e));
  }
  if (m.input_kind == "file" && (m.entries.size() != 1 || m.entries[0].type != EntryType::kFile ||
                                 m.entries[0].path.find('/') != std::string::npos))
    corrupt(origin, "of a single-file checkpoint must list exactly one file");
  if (get_u64(doc, "raw_bytes", "", origin) != m.raw_bytes() ||
      get_u64(doc, "stored_bytes", "", origin) != m.stored_bytes() ||
      get_u64(doc, "chunk_count", "", origin) != m.chunk_count())
    corrupt(origin, "totals do not match its entries");
  if (auto it = doc.find("extra"); it != doc.end()) {
    if (!it->is_object()) corrupt(origin, "field 'extra' is not an object");
    m.extra = *it;
  }
  return m;
}

Manifest load_manifest(const fs::path& checkpoint) {
  std::error_code ec;
  const auto st = fs::status(checkpoint, ec);
  if (!fs::exists(st))
    throw Error(Errc::kInvalidInput, "checkpoint " + checkpoint.string() + " does not exist");
  if (!fs::is_directory(st))
    throw Error(Errc::kInvalidInput, "checkpoint " + checkpoint.string() +
                                         " is not a directory (a checkpoint is a " +
                                         "directory holding " + kManifestName + " and blobs)");
  const fs::path mpath = checkpoint / kManifestName;
  if (!fs::exists(mpath, ec)) {
    // Blobs without a manifest: a damaged checkpoint; nothing at all: not a checkpoint.
    if (fs::exists(checkpoint / blob_name(0), ec))
      throw Error(Errc::kCorrupt, "checkpoint " + checkpoint.string() +
                                      " is damaged: " + kManifestName + " is missing");
    throw Error(Errc::kInvalidInput,
                checkpoint.string() + " is not a gpuckpt checkpoint (no " + kManifestName + ")");
  }
  return parse_manifest(read_file(mpath), checkpoint.string());
}

}  // namespace gpuckpt::image
