#include "data/corpus.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "core/file_io.h"

namespace hlm::data {

namespace fs = std::filesystem;

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool stat_file(const std::string& path, Document& d) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  d.file_bytes = static_cast<std::uint64_t>(st.st_size);
  d.mtime = static_cast<std::int64_t>(st.st_mtime);
  return true;
}

// Recursively collects regular files under root accepted by `keep`, skipping hidden entries. Keys are
// prefix + path relative to root ('/' separators).
template <typename Keep>
void scan_folder(const fs::path& root, const std::string& prefix, Keep keep, std::vector<Document>& out) {
  std::error_code ec;
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end;
  if (ec) fail("corpus: cannot read folder {}: {}", root.string(), ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) fail("corpus: error while scanning {}: {}", root.string(), ec.message());
    const fs::path& p = it->path();
    std::string fname = p.filename().string();
    if (!fname.empty() && fname[0] == '.') {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec)) continue;
    std::string rel = fs::relative(p, root, ec).generic_string();
    if (ec) rel = p.generic_string();
    if (!keep(rel, fname)) continue;
    Document d;
    d.path = fs::absolute(p).string();
    d.key = prefix + rel;
    if (!stat_file(d.path, d) || d.file_bytes == 0) continue;  // empty files hold no document
    out.push_back(std::move(d));
  }
}

void sort_by_key(std::vector<Document>& docs) {
  std::sort(docs.begin(), docs.end(), [](const Document& a, const Document& b) { return a.key < b.key; });
}

}  // namespace

std::uint64_t hash64(std::string_view s, std::uint64_t seed) {
  std::uint64_t h = 0xcbf29ce484222325ULL ^ seed;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h;
}

std::string Corpus::fingerprint() const {
  std::uint64_t bytes = 0, keys = 0;
  std::int64_t newest = 0;
  for (const auto& d : docs) {
    bytes += d.file_bytes;
    newest = std::max(newest, d.mtime);
    keys = hash64(d.key, keys);
  }
  return fmt::format("files={} bytes={} newest_mtime={} keys={:016x}", docs.size(), bytes, newest, keys);
}

bool is_text_file(std::string_view name) {
  if (ends_with(name, ".gz")) name = name.substr(0, name.size() - 3);
  return ends_with(name, ".txt") || ends_with(name, ".rst") || ends_with(name, ".md");
}

Corpus list_corpus(const std::string& path) {
  HLM_CHECK(!path.empty(), "corpus: empty data path");
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) fail("corpus: {} does not exist", path);
  Corpus c;
  fs::path abs = fs::absolute(path).lexically_normal();
  c.name = abs.has_filename() ? abs.filename().string() : abs.parent_path().filename().string();
  c.source = abs.string();
  if (fs::is_regular_file(st)) {
    Document d;
    d.path = abs.string();
    d.key = abs.filename().string();
    if (stat_file(d.path, d) && d.file_bytes > 0) c.docs.push_back(d);
  } else if (fs::is_directory(st)) {
    scan_folder(abs, "", [](const std::string&, const std::string& fname) { return is_text_file(fname); }, c.docs);
  } else {
    fail("corpus: {} is neither a file nor a folder", path);
  }
  if (c.docs.empty())
    fail("no documents found in {} (looked for non-empty .txt, .rst, .md, .rst.txt files, optionally .gz)", path);
  sort_by_key(c.docs);
  return c;
}

Corpus default_corpus() {
  struct Source {
    const char* root;
    const char* package;
    const char* prefix;
    const char* suffix;
  };
  // English only: the kernel's translations/ folder holds zh_CN, ja_JP, ... copies.
  const Source sources[] = {
      {"/usr/share/doc/python3.11/html/_sources", "python3.11-doc", "python3.11/", ".rst.txt"},
      {"/usr/share/doc/linux-doc-6.1/Documentation", "linux-doc-6.1", "linux-doc-6.1/", ".rst.gz"},
  };
  Corpus c;
  c.name = "default";
  c.source = "debian:python3.11-doc(/usr/share/doc/python3.11/html/_sources/**/*.rst.txt)+"
             "linux-doc-6.1(/usr/share/doc/linux-doc-6.1/Documentation/**/*.rst.gz, without translations/)";
  for (const Source& s : sources) {
    std::error_code ec;
    if (!fs::is_directory(s.root, ec))
      fail("default corpus: {} is missing; install it with `sudo apt-get install {}` (or run scripts/setup.sh)",
           s.root, s.package);
    size_t before = c.docs.size();
    std::string suffix = s.suffix;
    scan_folder(
        s.root, s.prefix,
        [&](const std::string& rel, const std::string& fname) {
          return ends_with(fname, suffix) && rel.rfind("translations/", 0) != 0;
        },
        c.docs);
    if (c.docs.size() == before)
      fail("default corpus: no {} files under {}; reinstall it with `sudo apt-get install --reinstall {}`", s.suffix,
           s.root, s.package);
  }
  sort_by_key(c.docs);
  return c;
}

Corpus open_corpus(const std::string& spec) { return spec == "default" ? default_corpus() : list_corpus(spec); }

std::string read_text_file(const std::string& path) {
  if (ends_with(path, ".gz")) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      fail("corpus: {} is not a regular file (a directory, FIFO or device)", path);
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) fail("corpus: cannot open {}", path);
    gzbuffer(f, 1 << 17);
    std::string out;
    std::vector<char> buf(1 << 20);
    for (;;) {
      int n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()));
      if (n < 0) {
        int errnum = 0;
        std::string msg = gzerror(f, &errnum);
        gzclose(f);
        fail("corpus: cannot decompress {}: {}", path, msg);
      }
      if (n == 0) break;
      out.append(buf.data(), static_cast<size_t>(n));
    }
    // A stream that ends early only shows up here (gzread returns the bytes it could decode).
    int errnum = Z_OK;
    std::string msg = gzerror(f, &errnum);
    int rc = gzclose(f);
    if (errnum != Z_OK || rc != Z_OK)
      fail("corpus: {} is truncated or corrupt ({})", path, errnum != Z_OK ? msg : "gzclose failed");
    return out;
  }
  return hlm::read_text_file(path, "text file", std::numeric_limits<std::size_t>::max());
}

std::string read_document(const Document& doc) { return read_text_file(doc.path); }

std::vector<bool> split_by_document(const std::vector<Document>& docs, double val_fraction) {
  HLM_CHECK(val_fraction >= 0 && val_fraction < 1, "split_by_document: val_fraction {} outside [0, 1)", val_fraction);
  const size_t n = docs.size();
  std::vector<bool> is_val(n, false);
  if (n < 2) return is_val;
  std::vector<std::uint64_t> h(n);
  size_t n_val = 0, lo = 0, hi = 0;
  for (size_t i = 0; i < n; ++i) {
    h[i] = hash64(docs[i].key);
    // Top 53 bits as a uniform number in [0, 1).
    double u = static_cast<double>(h[i] >> 11) * 0x1.0p-53;
    if (u < val_fraction) is_val[i] = true, ++n_val;
    if (h[i] < h[lo]) lo = i;
    if (h[i] > h[hi]) hi = i;
  }
  if (n_val == 0) is_val[lo] = true;
  if (n_val == n) is_val[hi] = false;
  return is_val;
}

}  // namespace hlm::data
