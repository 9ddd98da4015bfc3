#include "test_util.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include "common/status.h"

namespace tessera::testing {

namespace {
std::mutex g_mu;
std::vector<std::string>* g_dirs = nullptr;  // protected by g_mu

void RemoveDirs() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_dirs) return;
  for (const auto& d : *g_dirs) {
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
  }
}
}  // namespace

std::string FixturePath(const std::string& name) {
  return std::string(TESSERA_FIXTURES_DIR) + "/" + name;
}

std::string BinaryDir() { return TESSERA_BINARY_DIR; }

std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  TESSERA_CHECK(mkdtemp(buf.data()) != nullptr);
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_dirs) {
    g_dirs = new std::vector<std::string>();
    std::atexit(RemoveDirs);
  }
  g_dirs->emplace_back(buf.data());
  return g_dirs->back();
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace tessera::testing
