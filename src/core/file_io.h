#pragma once
// Checked small-file I/O. Every failure (cannot open, short write, disk full, fsync, rename) throws
// hlm::Error naming the file and the system's reason, so no write is silently lost.
#include <cstddef>
#include <string>

namespace hlm {

// Writes `contents` to path.tmp, fsyncs it, renames it over `path` and fsyncs the folder: a reader sees
// the old file or the new one, never a part.
void write_file_atomic(const std::string& path, const std::string& contents);

// Appends `text` to `path` (created if missing) with one write, checked.
void append_file(const std::string& path, const std::string& text);

// fsyncs a folder (makes renames and creations inside it durable); errors are ignored where the file system
// cannot sync folders.
void fsync_dir(const std::string& dir);

// Reads a whole regular file. Directories, FIFOs, devices and sockets are refused (a FIFO would block forever,
// /dev/zero never ends), as is a file over `max_bytes`. `what` names the file's role in messages ("config file").
std::string read_text_file(const std::string& path, const std::string& what = "file",
                           std::size_t max_bytes = std::size_t{256} << 20);

}  // namespace hlm
