// How `ampipe <subcommand> --help` is laid out and what an unknown flag is told: flags grouped like Megatron-LM's
// argument groups (model, MoE / AMPipe, parallelism, training, learning rate, checkpointing, data, logging), the
// refused ones in groups of their own, and the known flag closest to a mistyped one.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

namespace ampipe::cli {

// Puts every known flag of `sub` into its group of the registry (flag_registry.h; a flag it does not know stays
// where it is). add_flags sets the groups itself; this is for options made elsewhere.
void group_flags(CLI::App& sub);
// A help formatter that prints the groups in the order above.
std::shared_ptr<CLI::Formatter> grouped_formatter();
// The long flag of `app` closest to `flag` by edit distance (its "--name" before any '='), or "" when none is
// within max(2, length / 4) edits. A flag is never offered its opposite: a candidate that is `flag` with a leading
// no-, disable-, enable-, add- or use- added, dropped or exchanged (--disable-bias-linear is not --add-bias-linear).
// A candidate that `flag` is a prefix of (--seq-len: --seq-length) counts as within reach.
std::string closest_flag(const CLI::App& app, const std::string& flag);
// Edit distance (insertions, deletions, substitutions), for closest_flag.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace ampipe::cli
