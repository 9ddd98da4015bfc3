#include "bench/fleet_sim/thread_cpu.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

namespace tessera::fleet_sim {

namespace {

// utime + stime (fields 14 and 15 of proc(5)'s stat), in seconds; -1 when
// the line cannot be read.
double StatCpuSeconds(const std::string& line) {
  // The fields after the command name, which may hold spaces and ')'.
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 > line.size()) return -1;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  double utime = -1, stime = -1;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  if (utime < 0 || stime < 0) return -1;
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double Delta(const ThreadCpuSnapshot& before, pid_t tid, const ThreadCpuSample& now) {
  auto it = before.find(tid);
  return now.seconds - (it == before.end() ? 0.0 : it->second.seconds);
}

}  // namespace

ThreadCpuSnapshot SampleThreadCpu(pid_t pid) {
  ThreadCpuSnapshot out;
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(task, ec)) {
    const std::string dir = e.path().string();
    std::string stat, name;
    std::ifstream s(dir + "/stat");
    std::ifstream c(dir + "/comm");
    if (!std::getline(s, stat) || !std::getline(c, name)) continue;  // the thread ended
    const double seconds = StatCpuSeconds(stat);
    if (seconds < 0) continue;
    out[static_cast<pid_t>(std::stol(e.path().filename().string()))] = {name, seconds};
  }
  return out;
}

std::map<std::string, double> CoresByThreadGroup(const ThreadCpuSnapshot& before,
                                                 const ThreadCpuSnapshot& after, double seconds) {
  std::map<std::string, double> out;
  if (seconds <= 0) return out;
  for (const auto& [tid, now] : after) {
    std::string group = now.name;
    while (!group.empty() && group.back() >= '0' && group.back() <= '9') group.pop_back();
    out[group] += Delta(before, tid, now) / seconds;
  }
  return out;
}

std::pair<std::string, double> BusiestThread(const ThreadCpuSnapshot& before,
                                             const ThreadCpuSnapshot& after, double seconds) {
  std::pair<std::string, double> best{"", 0};
  if (seconds <= 0) return best;
  for (const auto& [tid, now] : after) {
    const double cores = Delta(before, tid, now) / seconds;
    if (cores > best.second) best = {now.name + " (tid " + std::to_string(tid) + ")", cores};
  }
  return best;
}

}  // namespace tessera::fleet_sim
