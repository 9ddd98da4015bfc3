#include "bench/fleet_sim/load_client.h"

#include <pthread.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>

namespace tessera::fleet_sim {

namespace beast = boost::beast;
namespace http = beast::http;
using tcp = boost::asio::ip::tcp;
using json = nlohmann::json;

namespace {

// The completion tokens of a whole event stream (its usage chunk), or -1
// when it lacks the usage chunk or does not end with [DONE]; `events`
// counts its "data:" events.
int64_t StreamedTokens(const std::string& body, int64_t* events) {
  int64_t tokens = -1;
  bool done = false;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t eol = body.find('\n', pos);
    if (eol == std::string::npos) eol = body.size();
    const std::string_view line(body.data() + pos, eol - pos);
    pos = eol + 1;
    if (line.substr(0, 6) != "data: ") continue;
    ++*events;
    const std::string_view data = line.substr(6);
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    json j = json::parse(data, nullptr, false);
    if (j.is_object() && j.contains("usage") && j["usage"].is_object())
      tokens = j["usage"].value("completion_tokens", int64_t{-1});
  }
  return done ? tokens : -1;
}

}  // namespace

void LoadClient::Start() {
  stop_ = false;
  for (int i = 0; i < options_.clients; ++i) threads_.emplace_back([this] { Run(); });
}

void LoadClient::Stop() {
  stop_ = true;
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

LoadStats LoadClient::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void LoadClient::Run() {
  // Named for the per-thread CPU split of the simulator (thread_cpu.h).
  pthread_setname_np(pthread_self(), "load-client");
  json body = {{"max_tokens", options_.max_tokens}, {"temperature", 0}};
  if (options_.stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  if (!options_.model.empty()) body["model"] = options_.model;
  http::request<http::string_body> req{http::verb::post, "/v1/completions", 11};
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::content_type, "application/json");
  req.keep_alive(true);
  static std::atomic<uint64_t> next_request{0};
  boost::asio::io_context ioc;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;
  auto record = [this](int status, int64_t tokens, int64_t events, double seconds,
                       const std::string& error) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.sent;
    if (status == 200 && tokens == options_.max_tokens) {
      ++stats_.ok;
      stats_.tokens += tokens;
      stats_.events += events;
      stats_.latencies_s.push_back(seconds);
      return;
    }
    if (status == 200) {
      ++stats_.short_;
    } else {
      ++stats_.failed;
      ++stats_.by_status[status];
    }
    if (stats_.first_error.empty()) stats_.first_error = error;
  };
  while (!stop_) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      if (!stream) {
        stream.emplace(ioc);
        stream->connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"),
                                      static_cast<unsigned short>(options_.port)));
        buffer.clear();
      }
      // Each prompt starts with its own number: no two share a first KV
      // block, so the router's prefix affinity does not pile them onto one
      // replica and the run measures routing by load.
      body["prompt"] = std::to_string(next_request++) + " " + options_.prompt;
      req.body() = body.dump();
      req.prepare_payload();
      stream->expires_after(std::chrono::seconds(120));
      http::write(*stream, req);
      http::response<http::string_body> res;
      http::read(*stream, buffer, res);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      int64_t tokens = -1, events = 0;
      if (res.result_int() == 200 && options_.stream) {
        tokens = StreamedTokens(res.body(), &events);
      } else if (res.result_int() == 200) {
        json j = json::parse(res.body(), nullptr, false);
        if (j.is_object() && j.contains("usage"))
          tokens = j["usage"].value("completion_tokens", int64_t{-1});
      }
      record(res.result_int(), tokens, events, s,
             res.result_int() == 200 ? "short answer: " + res.body().substr(0, 300)
                                     : res.body().substr(0, 300));
      if (!res.keep_alive()) stream.reset();
    } catch (const std::exception& e) {
      record(0, -1, 0, 0, std::string("connection: ") + e.what());
      stream.reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace tessera::fleet_sim
