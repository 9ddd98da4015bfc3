// FileStore: the Store (common/net/store.h) as a directory of files, one file per
// key. For tests and single-host runs where every rank sees the same
// directory; no server process is needed.
//
// A key's file name is the key with every byte outside [A-Za-z0-9_-]
// written as %XX, so any key (including "/" and "..") stays inside the
// directory. Set writes a temporary file and rename(2)s it over the key's
// file, so a reader sees the old value or the new one, never a torn one. Add
// holds an flock(2) on "<dir>/.lock" around its read-modify-write, so it is
// atomic across threads and processes. Get and Wait poll the directory
// (every 1-20 ms) until the file appears or the timeout passes.
//
// Thread-safety: every method may be called concurrently from any thread
// and any process sharing the directory.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/net/store.h"

namespace tessera {

class FileStore : public Store {
 public:
  // Uses `dir`, creating it (and its parents) if missing.
  // Errors: kIoError naming the directory.
  static StatusOr<std::unique_ptr<FileStore>> Open(const std::string& dir);

  Status Set(const std::string& key, const std::string& value) override;
  StatusOr<std::string> Get(const std::string& key, double timeout_seconds) override;
  Status Wait(const std::vector<std::string>& keys, double timeout_seconds) override;
  StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;

  const std::string& dir() const { return dir_; }
  // Path of the file that holds `key`.
  std::string KeyPath(const std::string& key) const;

 private:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
  // Writes `value` to a temporary file and renames it to KeyPath(key).
  Status WriteAtomically(const std::string& key, const std::string& value);

  const std::string dir_;
  std::atomic<uint64_t> tmp_counter_{0};
};

}  // namespace tessera
