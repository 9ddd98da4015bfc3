#include "common/net/file_store.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "support/multi_process.h"
#include "support/test_util.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<FileStore> OpenStore(const std::string& dir) {
  auto store = FileStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return std::move(store).value();
}

TEST(FileStore, SetGetOverwriteAndKeyEscaping) {
  const std::string dir = testing::MakeTempDir("tessera-filestore") + "/nested/store";
  auto store = OpenStore(dir);  // creates the missing directories
  std::string binary("x\0y", 3);
  ASSERT_TRUE(store->Set("tp.stage0/1", binary).ok());
  EXPECT_EQ(*store->Get("tp.stage0/1", 0), binary);
  ASSERT_TRUE(store->Set("tp.stage0/1", "v2").ok());
  EXPECT_EQ(*store->Get("tp.stage0/1", 0), "v2");
  // Keys that look like paths stay inside the directory.
  ASSERT_TRUE(store->Set("../escape", "no").ok());
  EXPECT_EQ(std::filesystem::path(store->KeyPath("../escape")).parent_path(), dir);
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir).parent_path() / "escape"));
  EXPECT_EQ(*store->Get("../escape", 0), "no");
  // No temporary files are left behind.
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    EXPECT_NE(e.path().filename().string().rfind(".tmp", 0), 0u) << e.path();
  }
}

TEST(FileStore, GetWaitsAndTimesOut) {
  auto store = OpenStore(testing::MakeTempDir("tessera-filestore"));
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    EXPECT_TRUE(store->Set("late", "here").ok());
  });
  auto v = store->Get("late", 5.0);
  t.join();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "here");

  auto start = Clock::now();
  auto missing = store->Get("missing", 0.2);
  double took = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(missing.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(missing.status().message().find("'missing'"), std::string::npos)
      << missing.status().ToString();
  EXPECT_GE(took, 0.19);
  EXPECT_LT(took, 1.0);

  Status s = store->Wait({"late", "b", "c"}, 0.1);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  const std::string tail = "waiting for keys 'b', 'c'";
  EXPECT_EQ(s.message().substr(s.message().size() - tail.size()), tail) << s.ToString();
  EXPECT_TRUE(store->Wait({"late"}, 0).ok());
}

TEST(FileStore, AddIsAtomicAcrossProcesses) {
  const std::string dir = testing::MakeTempDir("tessera-filestore");
  constexpr int kProcs = 4, kAdds = 50;
  auto outcomes = testing::RunRanks(kProcs, [&](int) -> std::string {
    auto store = FileStore::Open(dir);
    RANK_CHECK_OK(store.status());
    for (int i = 0; i < kAdds; ++i) RANK_CHECK_OK((*store)->Add("counter", 1).status());
    return "";
  });
  for (const auto& o : outcomes) EXPECT_EQ(o.exit_code, 0) << testing::Describe(o);
  auto store = OpenStore(dir);
  EXPECT_EQ(*store->Add("counter", 0), kProcs * kAdds);
  EXPECT_EQ(*store->Add("other", -3), -3);
  ASSERT_TRUE(store->Set("text", "abc").ok());
  auto bad = store->Add("text", 1);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'text'"), std::string::npos) << bad.status().ToString();
}

TEST(FileStore, OpenFailsOnAFile) {
  const std::string dir = testing::MakeTempDir("tessera-filestore");
  ASSERT_TRUE(OpenStore(dir)->Set("k", "v").ok());
  auto bad = FileStore::Open(OpenStore(dir)->KeyPath("k"));
  EXPECT_EQ(bad.status().code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace tessera
