// `tessera plan` run in process (cli/plan_command.cc): with --cluster it prints
// a running coordinator's plan, so every option that shapes a dry run, which is
// every option the subcommand registers but --cluster, --token and --help, is
// refused by name before any call.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace tessera::cli {
namespace {

// Port 1 refuses the connection: a run that got past the refusal fails there, quickly.
constexpr const char* kNoCoordinator = "127.0.0.1:1";

struct PlanRun {
  int exit_code = -1;
  std::string err;  // stderr
};

// A `tessera` app with the plan subcommand, as cli/main.cc builds it.
struct PlanCli {
  CLI::App app{"tessera"};
  Subcommand plan = AddPlanCommand(app);

  // Parses `tessera plan <args>` and runs the subcommand, capturing stderr.
  PlanRun Run(std::vector<std::string> args) {
    args.insert(args.begin(), "plan");
    std::reverse(args.begin(), args.end());  // CLI11 parses a vector from its back
    app.parse(args);
    ::testing::internal::CaptureStderr();
    PlanRun r;
    r.exit_code = plan.run();
    r.err = ::testing::internal::GetCapturedStderr();
    return r;
  }
};

std::string Refusal(const std::string& options) {
  return "--cluster prints the running coordinator's plan, which " + options +
         " would not change (they shape a dry run)";
}

// Each option the subcommand registers, given beside --cluster, is refused by name.
TEST(PlanCommand, ClusterRefusesEveryDryRunOptionItRegisters) {
  // A value each option's check accepts ("1" for the rest: numbers, paths, names).
  const std::map<std::string, std::string> kValues = {{"--objective", "latency"},
                                                      {"--gpu-memory-fraction", "0.5"},
                                                      {"--quantization", "none"},
                                                      {"--kv-cache-dtype", "auto"}};
  std::vector<std::string> names;
  std::vector<bool> flags;
  {
    PlanCli cli;
    for (const CLI::Option* opt : cli.plan.app->get_options()) {
      const std::string name = opt->get_name();
      if (name == "--cluster" || name == "--token" || opt == cli.plan.app->get_help_ptr()) continue;
      names.push_back(name);
      flags.push_back(opt->get_expected_max() == 0);
    }
  }
  // --model, --topology, the planner's options and the three flags, at least.
  ASSERT_GE(names.size(), 17u);
  for (size_t i = 0; i < names.size(); ++i) {
    PlanCli cli;
    std::vector<std::string> args = {"--cluster", kNoCoordinator, names[i]};
    if (!flags[i]) {
      auto v = kValues.find(names[i]);
      args.push_back(v == kValues.end() ? "1" : v->second);
    }
    const PlanRun r = cli.Run(args);
    EXPECT_EQ(r.exit_code, 1) << names[i];
    EXPECT_NE(r.err.find(Refusal(names[i])), std::string::npos) << names[i] << ": " << r.err;
  }
}

// An option registered after the others (as a new dry-run option would be) is refused too,
// beside the ones given before it and in the order of registration; --token is not refused.
TEST(PlanCommand, ClusterRefusesAnOptionNoListNamed) {
  int knob = 0;  // outlives the app that writes it
  PlanCli cli;
  cli.plan.app->add_option("--new-knob", knob, "a dry-run option added later");
  const PlanRun r =
      cli.Run({"--cluster", kNoCoordinator, "--new-knob", "3", "--max-batch", "8", "--token", "t"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(Refusal("--max-batch, --new-knob")), std::string::npos) << r.err;

  PlanCli token_only;
  const PlanRun allowed = token_only.Run({"--cluster", kNoCoordinator, "--token", "t"});
  EXPECT_EQ(allowed.exit_code, 1);  // no coordinator at port 1
  EXPECT_EQ(allowed.err.find("would not change"), std::string::npos) << allowed.err;
}

}  // namespace
}  // namespace tessera::cli
