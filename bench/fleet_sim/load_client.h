// LoadClient: a closed-loop load generator for the OpenAI API. `clients`
// threads each hold one keep-alive HTTP/1.1 connection (Boost.Beast) and
// send POST /v1/completions one after another until Stop: the prompt behind
// a number of its own (no two requests share a first KV block, so prefix
// affinity does not steer them), max_tokens new tokens, streamed (SSE, with
// stream_options.include_usage) or not. A connection that breaks is opened
// again.
//
// Each answer is checked: status 200 and usage.completion_tokens ==
// max_tokens (the simulated workers never emit EOS; a stream must also end
// with data: [DONE]), so a request lost or cut short shows up as a failure,
// never as a slower success.
//
// Threading: Start and Stop from one thread; stats from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tessera::fleet_sim {

struct LoadOptions {
  int port = 0;  // the API listener on 127.0.0.1
  int clients = 64;
  int max_tokens = 4;
  std::string prompt = "The fleet simulator asks";
  std::string model;    // "model" of each request ("" = left out)
  bool stream = false;  // "stream": true; the whole event stream is read, then checked
};

struct LoadStats {
  int64_t sent = 0;
  int64_t ok = 0;                    // 200 with every token
  int64_t short_ = 0;                // 200 with fewer tokens than asked
  int64_t failed = 0;                // any other status, or a broken connection mid-request
  int64_t tokens = 0;                // completion tokens of the ok answers
  int64_t events = 0;                // SSE events of the ok streamed answers ([DONE] included)
  std::map<int, int64_t> by_status;  // non-200 statuses (0: connection failed)
  std::string first_error;
  std::vector<double> latencies_s;  // of the ok answers
};

class LoadClient {
 public:
  explicit LoadClient(LoadOptions options) : options_(std::move(options)) {}
  ~LoadClient() { Stop(); }
  void Start();
  void Stop();
  LoadStats stats() const;

 private:
  void Run();
  LoadOptions options_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  mutable std::mutex mu_;
  LoadStats stats_;  // guarded by mu_
};

}  // namespace tessera::fleet_sim
