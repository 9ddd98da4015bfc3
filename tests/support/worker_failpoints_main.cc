// tessera-worker-failpoints, the test build's worker (tests/CMakeLists.txt):
// tessera-worker that also reads the failpoints of
// worker/daemon/worker_failpoints.h from its environment, so the fault tests
// can make a worker that never loads, or one whose step hangs. Only this
// file reads them: tessera-worker has no way to set them.
#include <cstdlib>

#include "worker/daemon/worker_failpoints.h"
#include "worker/daemon/worker_program.h"

int main(int argc, char** argv) {
  return tessera::RunWorkerProgram(argc, argv, [](tessera::WorkerDaemonOptions& o) {
    auto failpoints = tessera::ParseWorkerFailpoints(std::getenv("TESSERA_FAILPOINT_IGNORE_ASSIGN"),
                                                     std::getenv("TESSERA_FAILPOINT_STEP_SLEEP"));
    if (!failpoints.ok()) return failpoints.status();
    o.failpoints = *failpoints;
    return tessera::Status::Ok();
  });
}
