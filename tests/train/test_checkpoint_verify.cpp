// Checkpoints are verified on load (issue 13, "checkpoints that load when they should not"): each way a checkpoint
// can be damaged or mixed up is refused with one ConfigError naming the file and what is wrong, and an intact one
// still loads. One-rank trainer (MPI singleton), the tiny model of train_harness.h.
#include <gmock/gmock.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "ampipe/core/safetensors.h"
#include "train/train_harness.h"

using namespace ampipe;
using namespace ampipe::testing;
namespace fs = std::filesystem;

namespace {

comm::Runtime* g_rt = nullptr;
comm::Groups* g_groups = nullptr;

class RuntimeEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    static int argc = 1;
    static char name[] = "test_train_checkpoint_verify";
    static char* args[] = {name, nullptr};
    static char** argv = args;
    g_rt = new comm::Runtime(&argc, &argv);
    g_groups = new comm::Groups(g_rt->make_groups(comm::Layout::make(1, 1, 1, 1)));
  }
  void TearDown() override {
    delete g_groups;
    delete g_rt;
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new RuntimeEnv);

// A checkpoint directory with iterations 2 and 4 (marker: 4), made once and copied for each case.
class CheckpointVerify : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pristine_ = (fs::temp_directory_path() / ("ampipe_ckpt_verify_" + std::to_string(::getpid()))).string();
    fs::remove_all(pristine_);
    train::TrainConfig c = tiny_config();
    c.train_iters = 4;
    c.lr_warmup_iters = 1;
    c.save = pristine_;
    c.save_interval = 2;
    run_training(c, *g_groups);
  }
  static void TearDownTestSuite() { fs::remove_all(pristine_); }
  void SetUp() override {
    dir_ = pristine_ + "_case";
    fs::remove_all(dir_);
    fs::copy(pristine_, dir_, fs::copy_options::recursive);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string load_error() {
    train::TrainConfig lc = tiny_config();
    lc.load = dir_;
    try {
      train::Trainer r(lc, *g_groups, corpus_data(lc));
      r.maybe_load();
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  }
  std::string it4(const std::string& file) const { return dir_ + "/iter_0000004/" + file; }
  nlohmann::json read_meta() const {
    std::ifstream in(it4("metadata.json"));
    return nlohmann::json::parse(in);
  }
  void write_meta(const nlohmann::json& j) const { std::ofstream(it4("metadata.json"), std::ios::trunc) << j.dump(2); }

  static std::string pristine_;
  std::string dir_;
};
std::string CheckpointVerify::pristine_;

}  // namespace

TEST_F(CheckpointVerify, AnIntactCheckpointLoads) { EXPECT_EQ(load_error(), ""); }

TEST_F(CheckpointVerify, AFlippedDataByteIsRefused) {
  {
    std::fstream f(it4("model.safetensors"), std::ios::binary | std::ios::in | std::ios::out);
    f.seekg(-5, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-5, std::ios::end);
    f.put(char(c ^ 0x10));
  }
  EXPECT_THAT(load_error(), ::testing::AllOf(::testing::HasSubstr(it4("model.safetensors") + ": tensor '"),
                                             ::testing::HasSubstr("does not match its checksum")));
}

TEST_F(CheckpointVerify, AFileOfAnotherIterationIsRefused) {
  fs::copy_file(dir_ + "/iter_0000002/optimizer.safetensors", it4("optimizer.safetensors"),
                fs::copy_options::overwrite_existing);
  EXPECT_THAT(load_error(), ::testing::HasSubstr("--load " + it4("optimizer.safetensors") +
                                                 ": the file says iteration 2, its directory and "
                                                 "latest_checkpointed_iteration.txt say 4"));
  // metadata.json of another iteration: its iteration differs from the directory's and the marker's.
  fs::copy_file(dir_ + "/iter_0000002/metadata.json", it4("metadata.json"), fs::copy_options::overwrite_existing);
  EXPECT_THAT(load_error(), ::testing::HasSubstr("\"iteration\" 2 is out of range: it must equal the iteration of "
                                                 "its directory and of latest_checkpointed_iteration.txt, 4"));
}

TEST_F(CheckpointVerify, ARewrittenFileWithValidChecksumsIsNotTheRecordedOne) {
  // Same names, shapes and iteration, other values, fresh checksums: only metadata.json's record can tell.
  std::map<std::string, std::string> meta;
  core::TensorMap m = core::load_safetensors(it4("model.safetensors"), &meta);
  for (auto& [name, t] : m) t = Tensor::zeros(t.shape());
  core::save_safetensors(it4("model.safetensors"), m, meta);
  EXPECT_THAT(load_error(), ::testing::HasSubstr("is not the one " + it4("metadata.json") + " recorded at save"));
}

TEST_F(CheckpointVerify, NonFiniteWeightsAreRefused) {
  std::map<std::string, std::string> meta;
  core::TensorMap m = core::load_safetensors(it4("model.safetensors"), &meta);
  Tensor& w = m.at("final_layernorm.weight");
  w.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  const core::SafetensorsInfo info = core::save_safetensors(it4("model.safetensors"), m, meta);
  nlohmann::json j = read_meta();  // recorded as if saved so: only the values are wrong
  j["files"]["model.safetensors"] = {{"bytes", info.file_bytes}, {"header_checksum", info.header_checksum}};
  write_meta(j);
  EXPECT_THAT(load_error(), ::testing::HasSubstr("--load " + it4("model.safetensors") +
                                                 ": tensor final_layernorm.weight: element 3 is nan"));
}

TEST_F(CheckpointVerify, MetadataValuesOutOfRangeAreRefused) {
  const nlohmann::json good = read_meta();
  auto with = [&](const char* key, const nlohmann::json& v) {
    nlohmann::json j = good;
    j[key] = v;
    write_meta(j);
    return load_error();
  };
  EXPECT_THAT(with("consumed_samples", -100), ::testing::HasSubstr("\"consumed_samples\" -100 is out of range"));
  EXPECT_THAT(with("consumed_samples", "8"), ::testing::HasSubstr("\"consumed_samples\" is \"8\", not an integer"));
  EXPECT_THAT(with("optimizer_steps", 5), ::testing::HasSubstr("\"optimizer_steps\" 5 is out of range"));
  EXPECT_THAT(with("optimizer_steps", 18446744073709551615ull),
              ::testing::HasSubstr("\"optimizer_steps\" 18446744073709551615 is out of range"));
  EXPECT_THAT(with("version", 1), ::testing::HasSubstr("checkpoint version 1 cannot be loaded"));
  EXPECT_THAT(with("files", nullptr), ::testing::HasSubstr("\"files\""));
  EXPECT_THAT(with("format", "x"), ::testing::HasSubstr("not the metadata of an ampipe train checkpoint"));
  write_meta(good);
  EXPECT_EQ(load_error(), "");
}

TEST_F(CheckpointVerify, ABadMarkerIsRefused) {
  std::ofstream(dir_ + "/" + train::kLatestMarker, std::ios::trunc) << "99999999999999999999\n";
  EXPECT_THAT(load_error(), ::testing::HasSubstr("latest_checkpointed_iteration.txt is corrupt"));
  std::ofstream(dir_ + "/" + train::kLatestMarker, std::ios::trunc) << "3\n";
  EXPECT_THAT(load_error(), ::testing::HasSubstr("iter_0000003/metadata.json: the file is missing"));
}
