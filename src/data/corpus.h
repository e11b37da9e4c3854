#pragma once
// Text corpora as lists of documents (one file = one document), read lazily. A corpus is a file, a
// folder (searched recursively for .txt, .rst, .md, .rst.txt and their .gz) or the built-in default
// corpus: the English reST sources that Debian's python3.11-doc and linux-doc-6.1 install.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hlm::data {

struct Document {
  std::string path;           // file to read (absolute)
  std::string key;            // stable id (path relative to the corpus root, with a source prefix)
  std::uint64_t file_bytes = 0;  // size on disk (compressed size for .gz)
  std::int64_t mtime = 0;     // seconds since the epoch, for the cache fingerprint
};

struct Corpus {
  std::string name;    // "default" or the file/folder name
  std::string source;  // where it came from, for meta.json
  std::vector<Document> docs;  // sorted by key

  // A cheap summary that changes when files are added, removed, resized or touched.
  std::string fingerprint() const;
};

// True for the extensions a folder scan picks up (.txt .rst .md .rst.txt, optionally + .gz).
bool is_text_file(std::string_view filename);

// A file (any name) or a folder (recursive, hidden entries skipped). Throws hlm::Error
// "no documents found in <path>" when nothing matches, or when the path does not exist.
Corpus list_corpus(const std::string& path);

// The built-in corpus. Throws hlm::Error naming the apt package to install when sources are missing.
Corpus default_corpus();

// "default" -> default_corpus(), anything else -> list_corpus(spec).
Corpus open_corpus(const std::string& spec);

// Whole file contents; .gz files are decompressed. Throws hlm::Error naming the file.
std::string read_document(const Document& doc);
std::string read_text_file(const std::string& path);

// 64-bit hash of a string (FNV-1a followed by a splitmix64 finaliser: well mixed in every bit).
std::uint64_t hash64(std::string_view s, std::uint64_t seed = 0);

// Train/val split by document: a document goes to val when hash64(key) maps below val_fraction.
// At least one document goes to val and at least one stays in train (when there are two or more).
// Returns is_val per document; deterministic for a given set of keys.
std::vector<bool> split_by_document(const std::vector<Document>& docs, double val_fraction);

}  // namespace hlm::data
