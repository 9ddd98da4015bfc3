#include "common/net/file_store.h"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Reads a whole file. Returns kNotFound if it does not exist.
StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return NotFound(path);
    return IoError(fmt::format("FileStore: cannot read {}: {}", path, std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Polls `ready` with a growing sleep (1 ms doubling to 20 ms) until it returns
// true or `timeout_seconds` pass. Returns whether it became true.
template <typename Pred>
bool PollUntil(double timeout_seconds, Pred ready) {
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(std::max(0.0, timeout_seconds)));
  auto sleep = std::chrono::milliseconds(1);
  for (;;) {
    if (ready()) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(sleep, deadline - Clock::now()));
    sleep = std::min(sleep * 2, std::chrono::milliseconds(20));
  }
}

}  // namespace

StatusOr<std::unique_ptr<FileStore>> FileStore::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir)) {
    return IoError(fmt::format("FileStore: cannot create directory {}: {}", dir,
                               ec ? ec.message() : "not a directory"));
  }
  return std::unique_ptr<FileStore>(new FileStore(dir));
}

std::string FileStore::KeyPath(const std::string& key) const {
  std::string name = "k_";
  for (unsigned char ch : key) {
    if (std::isalnum(ch) || ch == '_' || ch == '-') {
      name.push_back(static_cast<char>(ch));
    } else {
      name += fmt::format("%{:02X}", ch);
    }
  }
  return dir_ + "/" + name;
}

Status FileStore::WriteAtomically(const std::string& key, const std::string& value) {
  std::string tmp = fmt::format("{}/.tmp.{}.{}", dir_, getpid(), tmp_counter_.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    if (!out) {
      std::remove(tmp.c_str());
      return IoError(fmt::format("FileStore: cannot write {} (key '{}')", tmp, key));
    }
  }
  std::string path = KeyPath(key);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    return IoError(fmt::format("FileStore: cannot rename {} to {} (key '{}'): {}", tmp, path, key,
                               std::strerror(err)));
  }
  return Status::Ok();
}

Status FileStore::Set(const std::string& key, const std::string& value) {
  return WriteAtomically(key, value);
}

StatusOr<std::string> FileStore::Get(const std::string& key, double timeout_seconds) {
  std::string path = KeyPath(key);
  if (!PollUntil(timeout_seconds, [&] { return Exists(path); })) {
    return DeadlineExceeded(
        fmt::format("FileStore {}: get('{}'): timed out after {:.1f} s waiting "
                    "for the key",
                    dir_, key, std::max(0.0, timeout_seconds)));
  }
  return ReadFile(path);
}

Status FileStore::Wait(const std::vector<std::string>& keys, double timeout_seconds) {
  std::vector<std::string> missing;
  auto all_exist = [&] {
    missing.clear();
    for (const auto& k : keys) {
      if (!Exists(KeyPath(k))) missing.push_back(k);
    }
    return missing.empty();
  };
  if (PollUntil(timeout_seconds, all_exist)) return Status::Ok();
  std::string names;
  for (const auto& k : missing) names += (names.empty() ? "'" : ", '") + k + "'";
  return DeadlineExceeded(
      fmt::format("FileStore {}: wait: timed out after {:.1f} s waiting for "
                  "key{} {}",
                  dir_, std::max(0.0, timeout_seconds), missing.size() == 1 ? "" : "s", names));
}

StatusOr<int64_t> FileStore::Add(const std::string& key, int64_t delta) {
  std::string lock_path = dir_ + "/.lock";
  int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return IoError(fmt::format("FileStore: cannot open {}: {}", lock_path, std::strerror(errno)));
  }
  while (flock(fd, LOCK_EX) != 0) {
    if (errno != EINTR) {
      int err = errno;
      close(fd);
      return IoError(fmt::format("FileStore: flock {}: {}", lock_path, std::strerror(err)));
    }
  }
  auto result = [&]() -> StatusOr<int64_t> {
    int64_t current = 0;
    StatusOr<std::string> old = ReadFile(KeyPath(key));
    if (old.ok()) {
      char* end = nullptr;
      errno = 0;
      long long v = std::strtoll(old->c_str(), &end, 10);
      if (old->empty() || *end != '\0' || errno != 0) {
        return InvalidArgument(
            fmt::format("FileStore {}: add('{}'): the key holds a non-integer value", dir_, key));
      }
      current = v;
    } else if (old.status().code() != StatusCode::kNotFound) {
      return old.status();
    }
    int64_t next = current + delta;
    TESSERA_RETURN_IF_ERROR(WriteAtomically(key, std::to_string(next)));
    return next;
  }();
  flock(fd, LOCK_UN);
  close(fd);
  return result;
}

}  // namespace tessera
