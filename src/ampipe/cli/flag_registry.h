// Every flag of the `ampipe` binary, defined once (flag_registry.cpp): its name, the field it sets, its help group
// and text, its value grammar, whether it is a path (an empty one is refused), its --config key, which subcommands
// take it, for Megatron's refused flags the reason, and for the Megatron / MindSpeed flags accepted with no effect
// (GPU kernel fusion, NCCL/CUDA settings, dataloader workers, ...) why they have none. From this table come each
// subcommand's CLI11 options (add_flags), the help groups (flag_help.cpp), the --config keys (train_flags.cpp) and the
// settings the ranks of `ampipe train` compare (train_agreement.cpp, with train::config_keys() for the training
// configuration's).
// A flag declared anywhere else is a test failure (tests/cli/flags_in_registry.sh).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

namespace ampipe::cli {

struct LayerFlags;
struct CommFlags;
struct MemoryFlags;
struct TrainFlags;
struct LayerCheckArgs;
struct BenchLayerArgs;
struct PlanArgs;
struct SimulateArgs;
struct CalibrateArgs;
struct PreprocessArgs;
struct ConvertArgs;

// The subcommands, as bits of FlagSpec::subs.
enum Sub : unsigned {
  kLayerCheck = 1,
  kBenchLayer = 2,
  kTrain = 4,
  kPlan = 8,
  kCalibrate = 16,
  kSimulate = 32,
  kPreprocess = 64,
  kConvert = 128,
};
const char* sub_name(Sub sub);  // "bench-layer"

// The help groups, in the order `--help` prints them (flag_help.cpp). "Options" is CLI11's own group (with --help);
// the registry puts a subcommand's own tuning flags there on purpose.
inline constexpr const char* kGroupOptions = "Options";
inline constexpr const char* kGroupModel = "Model";
inline constexpr const char* kGroupMoe = "MoE and AMPipe";
inline constexpr const char* kGroupParallel = "Parallelism";
inline constexpr const char* kGroupTraining = "Training";
inline constexpr const char* kGroupLr = "Learning rate";
inline constexpr const char* kGroupCheckpoint = "Checkpointing";
inline constexpr const char* kGroupData = "Data and evaluation";
inline constexpr const char* kGroupLogging = "Logging and output";
inline constexpr const char* kGroupNotRun =
    "MindSpeed features parsed but refused (not run by this engine; with --ampipe-degree > 1 also incompatible)";
inline constexpr const char* kGroupNoEffect =
    "Megatron / MindSpeed flags accepted with no effect on this engine (a start-up note names them)";
inline constexpr const char* kGroupRefused = "Megatron flags this engine refuses (each says why)";
inline constexpr const char* kGroupHidden = "";  // not in --help (for the tests)
const std::vector<std::string>& help_group_order();

// How a flag's value is written. One parser each: CLI11's for the plain types, parse_degree for the degrees.
enum class Grammar {
  integer,      // int or int64_t
  uint64,       // 0 .. 2^64-1, digits only (--seed)
  number,       // double
  text,         // a string (parsed later by its user where it has more structure, e.g. --memory-limit)
  on_off,       // a switch: no value
  int_list,     // a comma list of integers (the sweeps)
  text_list,    // several values, as Megatron's nargs (--spec a b): space-separated, or one comma list in --config
  string_list,  // one or more values, as Megatron's nargs='*' / '+' (--data-path 0.7 A 0.3 B, --json-keys a b):
                // space-separated, or a JSON array (or one string) in --config; the field is a vector of strings
  degree,       // --ampipe-degree M: one integer
  degree_auto,  // --ampipe-degree M or auto
  degree_list,  // --ampipe-degree 1,2,4 or auto
};

// Flag attributes (FlagSpec::attrs).
enum FlagAttr : unsigned {
  kShowDefault = 1,  // --help shows the default
  kPath = 2,         // a path: "" is refused ("an empty path is not a file or directory")
  kRequired = 4,
  kNoConfig = 8,  // not a --config key (--config itself)
  kAgree = 16,    // its value as given joins train's rank agreement (train_agreement.cpp); train::config_keys()
                  // brings the training configuration's
  kUnsetZero = 32,  // an integer whose field holds 0 for "not given" (a default derived later): a value given must be
                    // >= 1 (`--global-batch-size 0` used to run with the default); a 0 in --config (a checkpoint's
                    // metadata.json records the unset field) is the default
  kNonEmpty = 64,   // a text whose field holds "" for "not given": "" given is refused (`--split ''`)
};

// What the flags of one subcommand write to (null: that subcommand has none of those).
struct FlagTargets {
  LayerFlags* layer = nullptr;
  CommFlags* comm = nullptr;
  MemoryFlags* memory = nullptr;
  TrainFlags* train = nullptr;
  LayerCheckArgs* layer_check = nullptr;
  BenchLayerArgs* bench = nullptr;
  PlanArgs* plan = nullptr;
  SimulateArgs* simulate = nullptr;
  CalibrateArgs* calibrate = nullptr;
  PreprocessArgs* preprocess = nullptr;
  ConvertArgs* convert = nullptr;
};
// The field a flag sets.
using FlagRef = std::variant<bool*, int*, int64_t*, uint64_t*, double*, std::string*, std::vector<int>*,
                             std::vector<std::string>*>;

struct FlagSpec {
  std::string name;   // "--seq-length"
  unsigned subs = 0;  // Sub bits
  std::string group;
  Grammar grammar = Grammar::text;
  std::string help;
  FlagRef (*field)(const FlagTargets&) = nullptr;  // null for refused and no-op flags (RefusedFlags holds their
                                                   // values)
  unsigned attrs = 0;
  const char* refused = nullptr;   // Megatron's flags parsed only to be refused: the reason
  const char* accepted = nullptr;  // ... and the values accepted, "|"-separated, numbers compared as numbers
                                   // (nullptr: none)
  const char* noop = nullptr;      // Megatron / MindSpeed flags accepted with no effect: why ("GPU kernel fusion");
                                   // the start-up note names each one given with it (RefusedFlags::noop_note)
  const char* choices = nullptr;   // a no-op's values Megatron accepts, "|"-separated ("local|transformer_engine");
                                   // nullptr: any value of its grammar

  // The --config key (and JSON key): the flag without "--", dashes as underscores; "" with kNoConfig.
  std::string config_key() const;
};

// The registry: every flag, in --help order.
const std::vector<FlagSpec>& flag_registry();
// The flags `sub` takes, in that order.
std::vector<const FlagSpec*> flags_of(Sub sub);
// The entry of `sub` named `flag` ("--hidden-size"), or nullptr.
const FlagSpec* find_flag(Sub sub, const std::string& flag);
// The help group of `flag` ("--hidden-size": "Model"; a refused or no-op flag's only where no subcommand gives it a
// meaning: train's Megatron --profile is a no-op, simulate's --profile its hardware profile), or nullptr when no
// subcommand has it.
const char* flag_group(const std::string& flag);

// Adds the options of `sub` to `app`, bound to `t`. Refused flags go to t.train->refused.
void add_flags(CLI::App& app, Sub sub, const FlagTargets& t);
// The value of `spec`'s field in `t`, as JSON.
nlohmann::json flag_value(const FlagSpec& spec, const FlagTargets& t);

// --ampipe-degree, the one parser of its three grammars. Throws ConfigError naming the flag and the value.
struct Degrees {
  bool is_auto = false;
  std::vector<int> list;  // one for Grammar::degree and degree_auto (unless auto); positive, duplicates dropped
                          // and in order for degree_list
};
Degrees parse_degree(const std::string& text, Grammar grammar);

}  // namespace ampipe::cli
