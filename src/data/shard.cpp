#include "data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace hlm::data {

static_assert(std::endian::native == std::endian::little, "token shards are little-endian; add byte swaps here");

namespace {

void encode_header(const ShardHeader& h, unsigned char* out) {
  std::memset(out, 0, kShardHeaderBytes);
  std::memcpy(out + 0, kShardMagic, 8);
  std::memcpy(out + 8, &h.version, 4);
  std::memcpy(out + 12, &h.token_bytes, 4);
  std::memcpy(out + 16, &h.n_tokens, 8);
  std::memcpy(out + 24, &h.n_docs, 8);
  std::memcpy(out + 32, &h.vocab_size, 4);
  std::memcpy(out + 36, &h.eos_id, 4);
}

}  // namespace

std::uint32_t token_bytes_for_vocab(std::int64_t vocab_size) { return vocab_size <= 65536 ? 2u : 4u; }

ShardWriter::ShardWriter(const std::string& path, std::int64_t vocab_size, std::int32_t eos_id) : path_(path) {
  HLM_CHECK(vocab_size > 0 && vocab_size <= 0x7fffffff, "ShardWriter: vocab_size {} out of range for {}", vocab_size,
            path);
  HLM_CHECK(eos_id >= 0 && eos_id < vocab_size, "ShardWriter: eos_id {} outside [0, {}) for {}", eos_id, vocab_size,
            path);
  header_.token_bytes = token_bytes_for_vocab(vocab_size);
  header_.vocab_size = static_cast<std::uint32_t>(vocab_size);
  header_.eos_id = static_cast<std::uint32_t>(eos_id);
  f_ = std::fopen(path.c_str(), "wb");
  if (!f_) fail("shard: cannot create {}: {}", path, std::strerror(errno));
  // Placeholder header (n_tokens 0) until finish() knows the counts.
  unsigned char hdr[kShardHeaderBytes];
  encode_header(header_, hdr);
  if (std::fwrite(hdr, 1, sizeof hdr, f_) != sizeof hdr) fail("shard: cannot write {}: {}", path, std::strerror(errno));
}

ShardWriter::~ShardWriter() {
  if (f_) {
    std::fclose(f_);
    std::remove(path_.c_str());
  }
}

void ShardWriter::append(const std::int32_t* tokens, std::size_t n, std::uint64_t n_docs_ended) {
  HLM_CHECK(f_, "ShardWriter.append: {} is already finished", path_);
  const std::size_t chunk = 1 << 16;
  std::vector<unsigned char> buf(chunk * header_.token_bytes);
  for (std::size_t b = 0; b < n; b += chunk) {
    std::size_t m = std::min(chunk, n - b);
    for (std::size_t i = 0; i < m; ++i) {
      std::int32_t t = tokens[b + i];
      HLM_CHECK(t >= 0 && static_cast<std::uint32_t>(t) < header_.vocab_size,
                "ShardWriter.append: token {} at index {} outside [0, {}) for {}", t, header_.n_tokens + b + i,
                header_.vocab_size, path_);
      if (header_.token_bytes == 2) {
        std::uint16_t v = static_cast<std::uint16_t>(t);
        std::memcpy(&buf[i * 2], &v, 2);
      } else {
        std::uint32_t v = static_cast<std::uint32_t>(t);
        std::memcpy(&buf[i * 4], &v, 4);
      }
    }
    if (std::fwrite(buf.data(), header_.token_bytes, m, f_) != m)
      fail("shard: cannot write {}: {}", path_, std::strerror(errno));
  }
  header_.n_tokens += n;
  header_.n_docs += n_docs_ended;
}

void ShardWriter::finish() {
  HLM_CHECK(f_, "ShardWriter.finish: {} is already finished", path_);
  unsigned char hdr[kShardHeaderBytes];
  encode_header(header_, hdr);
  bool ok = std::fflush(f_) == 0 && std::fseek(f_, 0, SEEK_SET) == 0 &&
            std::fwrite(hdr, 1, sizeof hdr, f_) == sizeof hdr && std::fflush(f_) == 0 && ::fsync(fileno(f_)) == 0;
  int err = errno;
  ok = (std::fclose(f_) == 0) && ok;
  f_ = nullptr;
  if (!ok) {
    std::remove(path_.c_str());
    fail("shard: cannot finish {}: {}", path_, std::strerror(err));
  }
}

void write_shard(const std::string& path, const std::int32_t* tokens, std::size_t n, std::int64_t vocab_size,
                 std::int32_t eos_id, std::uint64_t n_docs) {
  ShardWriter w(path, vocab_size, eos_id);
  w.append(tokens, n, n_docs);
  w.finish();
}

TokenShard::TokenShard(const std::string& path, bool verify_tokens) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("shard {}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail("shard {}: cannot stat: {}", path, std::strerror(err));
  }
  const std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  if (size < kShardHeaderBytes) {
    ::close(fd);
    fail("shard {}: file is {} bytes, shorter than the {}-byte header (field header); the file is truncated", path,
         size, kShardHeaderBytes);
  }
  map_ = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail("shard {}: mmap failed: {}", path, std::strerror(err));
  }
  map_bytes_ = size;
  const unsigned char* p = static_cast<const unsigned char*>(map_);
  // Validate before anything is trusted; the destructor unmaps if we throw from here on.
  try {
    if (std::memcmp(p, kShardMagic, 8) != 0)
      fail("shard {}: bad magic (field magic): not a hybridlm token shard (expected \"HLMTOK01\")", path);
    std::memcpy(&header_.version, p + 8, 4);
    std::memcpy(&header_.token_bytes, p + 12, 4);
    std::memcpy(&header_.n_tokens, p + 16, 8);
    std::memcpy(&header_.n_docs, p + 24, 8);
    std::memcpy(&header_.vocab_size, p + 32, 4);
    std::memcpy(&header_.eos_id, p + 36, 4);
    if (header_.version != kShardVersion)
      fail("shard {}: unsupported version {} (field version; this build reads version {}); rebuild the shards",
           path, header_.version, kShardVersion);
    if (header_.token_bytes != 2 && header_.token_bytes != 4)
      fail("shard {}: token_bytes {} is neither 2 (uint16) nor 4 (uint32) (field token_bytes)", path,
           header_.token_bytes);
    if (header_.vocab_size == 0 || header_.vocab_size > 0x7fffffffu ||
        (header_.token_bytes == 2 && header_.vocab_size > 65536))
      fail("shard {}: vocab_size {} is invalid for {}-byte tokens (field vocab_size)", path, header_.vocab_size,
           header_.token_bytes);
    if (header_.eos_id >= header_.vocab_size)
      fail("shard {}: eos_id {} >= vocab_size {} (field eos_id)", path, header_.eos_id, header_.vocab_size);
    const std::uint64_t payload = size - kShardHeaderBytes;
    if (payload % header_.token_bytes != 0 || header_.n_tokens != payload / header_.token_bytes)
      fail("shard {}: header says n_tokens = {} but the file holds {} bytes of {}-byte tokens after the header "
           "(field n_tokens); the file is truncated or its header is wrong, rebuild it",
           path, header_.n_tokens, payload, header_.token_bytes);
    if (header_.n_docs > header_.n_tokens)
      fail("shard {}: n_docs {} > n_tokens {} (field n_docs)", path, header_.n_docs, header_.n_tokens);
    if (header_.token_bytes == 2)
      u16_ = reinterpret_cast<const std::uint16_t*>(p + kShardHeaderBytes);
    else
      u32_ = reinterpret_cast<const std::uint32_t*>(p + kShardHeaderBytes);
    if (verify_tokens) {
      const std::int64_t n = n_tokens();
      const std::uint32_t V = header_.vocab_size;
      std::uint32_t worst = 0;
      if (u16_) {
        for (std::int64_t i = 0; i < n; ++i) worst = std::max<std::uint32_t>(worst, u16_[i]);
      } else {
        for (std::int64_t i = 0; i < n; ++i) worst = std::max(worst, u32_[i]);
      }
      if (n > 0 && worst >= V) {
        std::int64_t at = 0;
        while ((*this)[at] != static_cast<std::int32_t>(worst)) ++at;
        fail("shard {}: token {} at index {} >= vocab_size {} (field vocab_size)", path, worst, at, V);
      }
    }
  } catch (...) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
}

TokenShard::~TokenShard() {
  if (map_) ::munmap(map_, map_bytes_);
}

void TokenShard::read(std::int64_t begin, std::int64_t n, std::int32_t* out) const {
  HLM_CHECK(begin >= 0 && n >= 0 && begin + n <= n_tokens(), "TokenShard.read: range [{}, {}) outside [0, {}) of {}",
            begin, begin + n, n_tokens(), path_);
  if (u16_) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = u16_[begin + i];
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<std::int32_t>(u32_[begin + i]);
  }
}

}  // namespace hlm::data
