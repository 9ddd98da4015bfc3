// tessera-worker: one per GPU (or CPU rank). Joins a coordinator, loads its
// shard and runs its pipeline stage until the coordinator shuts it down
// (worker/daemon/worker_program.h).
#include "worker/daemon/worker_program.h"

int main(int argc, char** argv) { return tessera::RunWorkerProgram(argc, argv); }
