// ThreadCpu: the CPU time of each thread of a process, from
// /proc/<pid>/task/<tid>/stat (utime + stime, proc(5)), to tell which
// threads of the simulator and of the coordinator spend a run's CPU.
//
// Threading: plain functions, safe from any thread.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>

namespace tessera::fleet_sim {

struct ThreadCpuSample {
  std::string name;    // /proc/<pid>/task/<tid>/comm: at most 15 bytes
  double seconds = 0;  // user + system CPU seconds since the thread started
};
// Every thread of `pid` now, by tid; empty when /proc cannot tell.
using ThreadCpuSnapshot = std::map<pid_t, ThreadCpuSample>;
ThreadCpuSnapshot SampleThreadCpu(pid_t pid);

// The CPU each group of threads spent from `before` to `after`, in cores
// (CPU seconds / `seconds`), a group being a thread name less its trailing
// digits ("sim-shard-12" -> "sim-shard-", "ZMQbg/IO/0" -> "ZMQbg/IO/"). A
// thread born in between counts from 0; one that ended is not counted.
std::map<std::string, double> CoresByThreadGroup(const ThreadCpuSnapshot& before,
                                                 const ThreadCpuSnapshot& after, double seconds);

// The busiest single thread over the same span: its name and cores.
std::pair<std::string, double> BusiestThread(const ThreadCpuSnapshot& before,
                                             const ThreadCpuSnapshot& after, double seconds);

}  // namespace tessera::fleet_sim
