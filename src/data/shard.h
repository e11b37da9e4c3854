#pragma once
// Token shards: one file = a 64-byte header + tokens (little-endian uint16 when the vocab fits, else
// uint32). Read through a read-only mmap. Header (version 1):
//   off  0  char[8] magic "HLMTOK01"
//   off  8  u32     version (1)
//   off 12  u32     token_bytes (2 = uint16, 4 = uint32)
//   off 16  u64     n_tokens
//   off 24  u64     n_docs (documents that end in this shard with <eos>, or 1 for a partial document)
//   off 32  u32     vocab_size (every token is < vocab_size)
//   off 36  u32     eos_id
//   off 40  24 bytes zero (reserved)
#include <cstdint>
#include <cstdio>
#include <string>

namespace hlm::data {

inline constexpr char kShardMagic[8] = {'H', 'L', 'M', 'T', 'O', 'K', '0', '1'};
inline constexpr std::uint32_t kShardVersion = 1;
inline constexpr std::size_t kShardHeaderBytes = 64;

struct ShardHeader {
  std::uint32_t version = kShardVersion;
  std::uint32_t token_bytes = 2;
  std::uint64_t n_tokens = 0;
  std::uint64_t n_docs = 0;
  std::uint32_t vocab_size = 0;
  std::uint32_t eos_id = 0;
};

// 2 when every id fits in uint16 (vocab_size <= 65536), else 4.
std::uint32_t token_bytes_for_vocab(std::int64_t vocab_size);

// Streams tokens to a file; finish() writes the final header and fsyncs. Destroying an unfinished
// writer removes the partial file.
class ShardWriter {
 public:
  ShardWriter(const std::string& path, std::int64_t vocab_size, std::int32_t eos_id);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends tokens (each checked against vocab_size); n_docs_ended documents end inside them.
  void append(const std::int32_t* tokens, std::size_t n, std::uint64_t n_docs_ended);
  void finish();
  std::uint64_t n_tokens() const { return header_.n_tokens; }
  std::uint64_t n_docs() const { return header_.n_docs; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  ShardHeader header_;
};

// Read-only view of a shard file. Opening validates every header field against the file size (and,
// by default, every token against vocab_size), throwing hlm::Error naming the file and the field.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path, bool verify_tokens = true);
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  std::int64_t n_tokens() const { return static_cast<std::int64_t>(header_.n_tokens); }
  std::int64_t n_docs() const { return static_cast<std::int64_t>(header_.n_docs); }
  std::int64_t vocab_size() const { return header_.vocab_size; }
  std::int32_t eos_id() const { return static_cast<std::int32_t>(header_.eos_id); }
  std::uint32_t token_bytes() const { return header_.token_bytes; }
  const ShardHeader& header() const { return header_; }
  const std::string& path() const { return path_; }

  std::int32_t operator[](std::int64_t i) const {
    return header_.token_bytes == 2 ? static_cast<std::int32_t>(u16_[i]) : static_cast<std::int32_t>(u32_[i]);
  }
  // out[0..n) = tokens[begin..begin+n); throws when the range leaves the shard.
  void read(std::int64_t begin, std::int64_t n, std::int32_t* out) const;

 private:
  std::string path_;
  ShardHeader header_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  const std::uint16_t* u16_ = nullptr;
  const std::uint32_t* u32_ = nullptr;
};

// Writes a whole shard in one call (tests, small tools).
void write_shard(const std::string& path, const std::int32_t* tokens, std::size_t n, std::int64_t vocab_size,
                 std::int32_t eos_id, std::uint64_t n_docs);

}  // namespace hlm::data
