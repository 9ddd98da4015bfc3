// How the CLI shows a running coordinator's plan (GET /admin/plan): the
// planner's placement and explanation as `tessera plan` prints a dry run,
// then the rank table with predicted and loaded weight and KV bytes.
// Used by `tessera up`, `tessera status` and `tessera plan --cluster`.
//
// Thread-safety: pure functions.
#pragma once

#include <string>

#include "common/base/status.h"

namespace tessera::cli {

// The text for the /admin/plan body `plan_json`; `with_explanation` adds the
// planner's explanation before the rank table. With several replicas, one
// placement line and rank table per replica ("replica 1: placement: tp=2
// pp=1 ..."; their layouts differ with parallel.replica_override), each
// distinct explanation once. A body that is not a plan (or a failed
// placement) yields its error and the planner's reasons.
std::string FormatServingPlan(const std::string& plan_json, bool with_explanation);

// "http://HOST:PORT", "HOST:PORT" or "PORT" (HOST 127.0.0.1).
// Errors: kInvalidArgument naming the URL (https, a path, a bad port).
Status ParseHttpUrl(const std::string& url, std::string* host, int* port);

}  // namespace tessera::cli
