// Log lines: rank/stage/node tags, the JSON format, and the load progress line.
#include "common/base/logging.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/base/load_progress.h"
#include "support/test_util.h"

namespace tessera {
namespace {

// Runs `fn` with stderr (the logger's sink) redirected to a file; returns
// what was written.
template <typename F>
std::string CaptureStderr(F&& fn) {
  const std::string path = ::tessera::testing::MakeTempDir("tessera-log") + "/stderr.txt";
  fflush(stderr);
  const int saved = dup(2);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, 2);
  close(fd);
  fn();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  return ::tessera::testing::ReadFileOrDie(path);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST(Logging, TextLinesCarryNodeAndRankTags) {
  const std::string out = CaptureStderr([] {
    SetLogJson(false);
    SetLogNode("gpu7");
    TESSERA_LOG_INFO("worker", "before the assignment");
    SetLogRank(9, 1, 1);
    TESSERA_LOG_WARN("worker", "after {}", "it");
  });
  const auto lines = Lines(out);
  ASSERT_EQ(lines.size(), 2u) << out;
  EXPECT_NE(lines[0].find("[info] [node=gpu7] [worker] before the assignment"), std::string::npos)
      << lines[0];
  EXPECT_NE(lines[1].find("[warning] [node=gpu7 rank=9 stage=1 tp_rank=1] [worker] after it"),
            std::string::npos)
      << lines[1];
}

TEST(Logging, JsonLinesAreOneObjectEach) {
  const std::string out = CaptureStderr([] {
    SetLogJson(true);
    SetLogNode("gpu \"7\"");
    SetLogRank(3, 0, 3);
    TESSERA_LOG_ERROR("coordinator", "two\nlines and a \"quote\"");
    TESSERA_LOG_INFO("load", "bad utf-8 \xff kept as a replacement");
    SetLogJson(false);
  });
  const auto lines = Lines(out);
  ASSERT_EQ(lines.size(), 2u) << out;
  const auto j = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j["level"], "error");
  EXPECT_EQ(j["node"], "gpu \"7\"");
  EXPECT_EQ(j["rank"], 3);
  EXPECT_EQ(j["stage"], 0);
  EXPECT_EQ(j["tp_rank"], 3);
  EXPECT_EQ(j["subsystem"], "coordinator");
  EXPECT_EQ(j["message"], "two\nlines and a \"quote\"");
  const std::string time = j["time"];
  EXPECT_EQ(time.size(), 24u) << time;  // 2026-01-02T03:04:05.678Z
  EXPECT_EQ(time.back(), 'Z');
  EXPECT_EQ(lines[0].rfind("{\"time\":", 0), 0u) << "time first, for humans reading raw lines";
  const auto k = nlohmann::json::parse(lines[1]);
  EXPECT_EQ(k["subsystem"], "load");
}

TEST(LoadProgress, FormatsBytesPercentAndRate) {
  EXPECT_EQ(FormatLoadProgress(312'000'000, 540'100'000, 2.0),
            "312.0 MB / 540.1 MB (57.8%), 156.0 MB/s");
  EXPECT_EQ(FormatLoadProgress(5'000'000, 0, 0), "5.0 MB");
}

TEST(LoadProgress, LogsAtTheIntervalAndOnceAtTheEnd) {
  const std::string out = CaptureStderr([] {
    SetLogJson(false);
    LoadProgressLog log("rank 2", 3600.0);
    for (int64_t done = 0; done <= 100; done += 10) log.Update(done * 1'000'000, 100'000'000);
    log.Update(100'000'000, 100'000'000);  // the end is logged once
  });
  const auto lines = Lines(out);
  ASSERT_EQ(lines.size(), 1u) << out;  // the interval is an hour: only the 100% line
  EXPECT_NE(lines[0].find("[load] loading rank 2: 100.0 MB / 100.0 MB (100.0%)"), std::string::npos)
      << lines[0];
}

}  // namespace
}  // namespace tessera
