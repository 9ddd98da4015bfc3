// Every source file of the build compiles once: a program that needs another
// program's code links the library that holds it (tessera-worker-failpoints the
// worker program of tessera_worker, tessera_gpu_test tessera_test_support)
// instead of compiling its files again. Read from the build's
// compile_commands.json (CMAKE_EXPORT_COMPILE_COMMANDS). The one exception is
// the fuzz build's tessera_fuzz_subjects (tests/fuzz/), which compiles the
// files it fuzzes again on purpose, with libFuzzer's coverage instrumentation.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "support/test_util.h"

namespace tessera {
namespace {

// The object a compile command writes (its -o argument), "" if none.
std::string ObjectOf(const std::string& command) {
  std::istringstream words(command);
  std::string word;
  while (words >> word)
    if (word == "-o" && words >> word) return word;
  return "";
}

TEST(CompileOnce, NoSourceFileIsCompiledByTwoTargets) {
  const std::string path = ::tessera::testing::BinaryDir() + "/compile_commands.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  const nlohmann::json db = nlohmann::json::parse(in);
  std::map<std::string, std::vector<std::string>> objects;  // source file -> its objects
  for (const nlohmann::json& entry : db) {
    const std::string object = ObjectOf(entry.value("command", ""));
    const std::string dir = entry.value("directory", "");
    // The fuzz build's own copies (Ninja names objects from the top build folder).
    if (object.rfind("tests/fuzz/", 0) == 0 || dir.ends_with("/tests/fuzz")) continue;
    objects[entry.at("file").get<std::string>()].push_back(object);
  }
  EXPECT_GT(objects.size(), 100u) << "too few compile commands in " << path;
  for (const auto& [file, objs] : objects) {
    std::string all;
    for (const std::string& o : objs) all += "\n  " + o;
    EXPECT_EQ(objs.size(), 1u) << file << " is compiled " << objs.size() << " times:" << all;
  }
}

}  // namespace
}  // namespace tessera
