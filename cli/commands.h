// Subcommands of the `tessera` CLI that live outside cli/main.cc. Each Add*
// function registers its subcommand and options on `app` and returns the
// subcommand with the function that runs it after parsing (exit status).
//
// Thread-safety: called from main only.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace tessera::cli {

struct Subcommand {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

// `tessera topo [--json | --toml] [--no-nvml] [--root DIR]`: this host's
// GPUs, links, NICs and memory (cli/topo_command.cc).
Subcommand AddTopoCommand(CLI::App& app);

// `tessera plan --model CONFIG_OR_DIR --topology FILE [--objective
// latency|throughput] ...`: a placement dry run; `tessera plan --cluster URL
// [--token T]`: a running coordinator's plan and reasoning
// (cli/plan_command.cc).
Subcommand AddPlanCommand(CLI::App& app);

// `tessera up` and `tessera status` (cli/up_command.cc).
Subcommand AddUpCommand(CLI::App& app);
Subcommand AddStatusCommand(CLI::App& app);

// `tessera keygen --out BASE`: a CURVE key pair for the control plane,
// BASE.key (secret, 0600) and BASE.pub (cli/keygen_command.cc).
Subcommand AddKeygenCommand(CLI::App& app);

}  // namespace tessera::cli
