// Checkpoints are verified on load (issue 13, "checkpoints that load when they should not"): each way a checkpoint
// can be damaged or mixed up is refused with one ConfigError naming the file and what is wrong, and an intact one
// still loads. One-rank trainer (MPI singleton), the tiny model of train_harness.h.
#include <gmock/gmock.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "ampipe/core/checksum.h"
#include "ampipe/core/safetensors.h"
#include "ampipe/train/checkpoint_args.h"
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
  // Writes metadata.json and re-signs the manifest "as if saved so" (every file's size and XXH64 as it is now, the
  // manifest's own checksum), so a case reaches the check it is about.
  void write_meta(const nlohmann::json& j) const {
    std::ofstream(it4("metadata.json"), std::ios::trunc) << j.dump(2);
    resign_manifest();
  }
  void resign_manifest() const {
    nlohmann::json man = read_json(it4(train::kManifestFile));
    for (const char* f : {"metadata.json", "model.safetensors", "optimizer.safetensors"}) {
      const std::string text = file_text(it4(f));
      man["files"][f] = {{"bytes", text.size()}, {"xxh64", core::checksum_string(core::xxh64(text.data(), text.size()))}};
    }
    man["checksum"] = train::manifest_self_checksum(man);
    std::ofstream(it4(train::kManifestFile), std::ios::trunc) << man.dump(2);
  }
  static std::string file_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  static nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(file_text(path)); }

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

// Each refusal of the optimizer file's values, and what must still load (issue 27: removing the check that refuses
// negative second moments went unnoticed). A damaged tensor is saved with fresh checksums and recorded in
// metadata.json as if saved so: only the values are wrong.
class OptimizerValues : public CheckpointVerify {
 protected:
  std::string with_value(const std::string& tensor, int64_t index, float value) {
    std::map<std::string, std::string> meta;
    core::TensorMap m = core::load_safetensors(it4("optimizer.safetensors"), &meta);
    m.at(tensor).data<float>()[index] = value;
    const core::SafetensorsInfo info = core::save_safetensors(it4("optimizer.safetensors"), m, meta);
    nlohmann::json j = read_meta();
    j["files"]["optimizer.safetensors"] = {{"bytes", info.file_bytes}, {"header_checksum", info.header_checksum}};
    write_meta(j);
    return load_error();
  }
  std::string file_() const { return "--load " + it4("optimizer.safetensors") + ": tensor "; }
};

TEST_F(OptimizerValues, ANegativeSecondMomentIsRefused) {
  EXPECT_THAT(with_value("exp_avg_sq.final_layernorm.weight", 2, -1e-12f),
              ::testing::HasSubstr(file_() + "exp_avg_sq.final_layernorm.weight: element 2 is -1e-12; a checkpoint "
                                           "must hold finite values (and second moments >= 0)"));
}

TEST_F(OptimizerValues, ANegativeSecondMomentDeepInALargeTensorIsRefused) {
  const core::TensorMap m = core::load_safetensors(it4("optimizer.safetensors"));
  const std::string name = "exp_avg_sq.layers.0.moe.experts.fc1.weight";
  ASSERT_TRUE(m.count(name)) << "the tiny model's expert weight is named otherwise";
  const int64_t last = m.at(name).numel() - 1;
  EXPECT_THAT(with_value(name, last, -3.0f),
              ::testing::HasSubstr(file_() + name + ": element " + std::to_string(last) + " is -3"));
}

TEST_F(OptimizerValues, NonFiniteMomentsAreRefused) {
  EXPECT_THAT(with_value("exp_avg.final_layernorm.bias", 0, std::numeric_limits<float>::infinity()),
              ::testing::HasSubstr(file_() + "exp_avg.final_layernorm.bias: element 0 is inf"));
  fs::remove_all(dir_);
  fs::copy(pristine_, dir_, fs::copy_options::recursive);
  EXPECT_THAT(with_value("exp_avg_sq.final_layernorm.bias", 1, std::numeric_limits<float>::quiet_NaN()),
              ::testing::HasSubstr(file_() + "exp_avg_sq.final_layernorm.bias: element 1 is nan"));
}

TEST_F(OptimizerValues, ANegativeFirstMomentAndANegativeZeroSecondMomentLoad) {
  EXPECT_EQ(with_value("exp_avg.final_layernorm.weight", 0, -5.0f), "");  // first moments have any sign
  EXPECT_EQ(with_value("exp_avg_sq.final_layernorm.weight", 0, -0.0f), "");  // -0 is not negative
}

TEST_F(CheckpointVerify, AMissingOrMisshapenTensorIsRefused) {
  std::map<std::string, std::string> meta;
  core::TensorMap m = core::load_safetensors(it4("model.safetensors"), &meta);
  const Tensor keep = m.at("final_layernorm.weight");
  auto save = [&] {
    const core::SafetensorsInfo info = core::save_safetensors(it4("model.safetensors"), m, meta);
    nlohmann::json j = read_meta();
    j["files"]["model.safetensors"] = {{"bytes", info.file_bytes}, {"header_checksum", info.header_checksum}};
    write_meta(j);
  };
  m.erase("final_layernorm.weight");
  save();
  EXPECT_THAT(load_error(), ::testing::HasSubstr("--load " + it4("model.safetensors") +
                                                 ": tensor final_layernorm.weight is missing"));
  m["final_layernorm.weight"] = Tensor::zeros({keep.numel() + 1});
  save();
  EXPECT_THAT(load_error(), ::testing::HasSubstr("tensor final_layernorm.weight is f32 [" +
                                                 std::to_string(keep.numel() + 1) + "], this run needs f32 [" +
                                                 std::to_string(keep.numel()) + "]"));
}

TEST_F(CheckpointVerify, AnotherModelShapeIsRefused) {
  train::TrainConfig lc = tiny_config();
  lc.load = dir_;
  lc.layer.ffn_hidden_size = 64;  // the checkpoint's is 32
  try {
    train::Trainer r(lc, *g_groups, corpus_data(lc));
    r.maybe_load();
    ADD_FAILURE() << "loaded a checkpoint of another model shape";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("the checkpoint has --ffn-hidden-size 32, this run has "
                                               "--ffn-hidden-size 64"));
  }
}

// Issue 27, item 3: every file of an iteration is recorded in manifest.json (size and XXH64), which carries its own
// checksum; metadata.json included, so an edited metadata.json (another head count: the same tensor shapes) never
// builds another model. Each refusal names the file, the expected and the found values.
TEST_F(CheckpointVerify, AnEditedMetadataIsRefusedByTheManifest) {
  nlohmann::json j = read_meta();
  j["config"]["num_attention_heads"] = 4;  // qkv stays [3h, h]: only the manifest can tell
  std::ofstream(it4("metadata.json"), std::ios::trunc) << j.dump(2);
  const std::string text = file_text(it4("metadata.json"));
  const nlohmann::json rec = read_json(it4(train::kManifestFile))["files"]["metadata.json"];
  const std::string want = "--load " + it4("metadata.json") + ": the file does not match manifest.json: expected " +
                           rec["bytes"].dump() + " bytes, " + rec["xxh64"].get<std::string>() + "; found " +
                           std::to_string(text.size()) + " bytes, " +
                           core::checksum_string(core::xxh64(text.data(), text.size()));
  EXPECT_THAT(load_error(), ::testing::HasSubstr(want));
  // --use-checkpoint-args reads the configuration first (read_checkpoint_info): refused there, before it is used.
  try {
    train::read_checkpoint_info(dir_, /*required=*/true);
    ADD_FAILURE() << "read an edited metadata.json";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(want));
  }
  // Without --use-checkpoint-args only the XXH64 of the manifest is taken (the ranks compare it).
  const std::string man = file_text(it4(train::kManifestFile));
  EXPECT_EQ(train::read_checkpoint_info(dir_, false)->manifest_checksum,
            core::checksum_string(core::xxh64(man.data(), man.size())));
}

TEST_F(CheckpointVerify, AnEditedManifestIsRefused) {
  nlohmann::json man = read_json(it4(train::kManifestFile));
  const std::string recorded = man["checksum"];
  man["files"]["metadata.json"]["bytes"] = 1;
  std::ofstream(it4(train::kManifestFile), std::ios::trunc) << man.dump(2);
  EXPECT_THAT(load_error(), ::testing::HasSubstr("--load " + it4(train::kManifestFile) +
                                                 ": the manifest does not match its own checksum: expected " +
                                                 recorded + " (recorded), found " +
                                                 train::manifest_self_checksum(man)));
  // A manifest of another iteration, signed: its iteration is not the marker's.
  fs::copy_file(dir_ + "/iter_0000002/" + train::kManifestFile, it4(train::kManifestFile),
                fs::copy_options::overwrite_existing);
  EXPECT_THAT(load_error(), ::testing::HasSubstr("the manifest says iteration 2, its directory and "
                                                 "latest_checkpointed_iteration.txt say 4"));
}

TEST_F(CheckpointVerify, ATensorFileThatIsNotTheManifestsIsRefused) {
  // Rewritten with valid checksums and recorded in metadata.json (whose record the manifest then re-signs): only the
  // manifest's XXH64 of the whole file differs. Here the tensor file changes after the manifest was signed.
  std::map<std::string, std::string> meta;
  core::TensorMap m = core::load_safetensors(it4("optimizer.safetensors"), &meta);
  const nlohmann::json rec = read_json(it4(train::kManifestFile))["files"]["optimizer.safetensors"];
  m.at("exp_avg.final_layernorm.weight").data<float>()[0] += 1.0f;
  const core::SafetensorsInfo info = core::save_safetensors(it4("optimizer.safetensors"), m, meta);
  nlohmann::json j = read_meta();
  j["files"]["optimizer.safetensors"] = {{"bytes", info.file_bytes}, {"header_checksum", info.header_checksum}};
  write_meta(j);  // signs the new file too ...
  nlohmann::json man = read_json(it4(train::kManifestFile));
  man["files"]["optimizer.safetensors"] = rec;  // ... so put back the save's record of it, signed
  man["checksum"] = train::manifest_self_checksum(man);
  std::ofstream(it4(train::kManifestFile), std::ios::trunc) << man.dump(2);
  EXPECT_THAT(load_error(), ::testing::HasSubstr("--load " + it4("optimizer.safetensors") +
                                                 ": the file does not match manifest.json: expected " +
                                                 rec["bytes"].dump() + " bytes, " + rec["xxh64"].get<std::string>() +
                                                 "; found " + std::to_string(info.file_bytes) + " bytes, " +
                                                 info.file_checksum));
}

TEST_F(CheckpointVerify, AMissingManifestIsRefusedAndAVersion2CheckpointLoads) {
  fs::remove(it4(train::kManifestFile));
  EXPECT_THAT(load_error(), ::testing::HasSubstr("--load " + it4(train::kManifestFile) +
                                                 ": the file is missing, but " + it4("metadata.json") +
                                                 " says checkpoint version 3"));
  // Relabelled version 2: the tensor files still say version 3.
  nlohmann::json j = read_meta();
  j["version"] = 2;
  std::ofstream(it4("metadata.json"), std::ios::trunc) << j.dump(2);
  EXPECT_THAT(load_error(), ::testing::HasSubstr("--load " + it4(train::kManifestFile) +
                                                 ": the file is missing, but " + it4("model.safetensors") +
                                                 " says checkpoint version 3"));
  // A checkpoint as version 2 wrote it (no manifest, tensor files without a version): still loads.
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    std::map<std::string, std::string> meta;
    const core::TensorMap m = core::load_safetensors(it4(f), &meta);
    meta.erase("checkpoint_version");
    const core::SafetensorsInfo info = core::save_safetensors(it4(f), m, meta);
    j["files"][f] = {{"bytes", info.file_bytes}, {"header_checksum", info.header_checksum}};
  }
  std::ofstream(it4("metadata.json"), std::ios::trunc) << j.dump(2);
  EXPECT_EQ(load_error(), "");
  EXPECT_EQ(train::read_checkpoint_info(dir_, true)->manifest_checksum, "none");
}

// Issue 27, item 2: --use-checkpoint-args compares the weights' shapes (the safetensors header only) with the model
// the metadata describes, naming the tensor, both shapes and the flags that shape it.
TEST(CheckpointShapes, TheWeightsMustBeTheModelTheMetadataDescribes) {
  const std::string dir = (fs::temp_directory_path() / ("ampipe_ckpt_shapes_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  train::TrainConfig c = tiny_config();
  c.train_iters = 1;
  c.lr_warmup_iters = 0;
  c.save = dir;
  run_training(c, *g_groups);
  const std::string model = dir + "/iter_0000001/model.safetensors";
  EXPECT_NO_THROW(train::check_checkpoint_shapes(model, c));
  const size_t n = train::checkpoint_tensor_shapes(c).size();
  EXPECT_EQ(n, core::read_safetensors_header(model).size() - 1);  // every tensor, "__metadata__" aside
  auto error = [&](const train::TrainConfig& cfg) {
    try {
      train::check_checkpoint_shapes(model, cfg);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  train::TrainConfig wider = c;
  wider.layer.hidden_size = 32;
  EXPECT_EQ(error(wider), "--use-checkpoint-args: --load " + model +
                              ": tensor embedding.word_embeddings.weight is [256, 16], but the model its metadata.json "
                              "describes needs [256, 32] (--padded-vocab-size 256, --hidden-size 32): the metadata "
                              "and the weights disagree");
  train::TrainConfig more_experts = c;
  more_experts.layer.num_experts = 8;
  EXPECT_THAT(error(more_experts), ::testing::HasSubstr("tensor layers.0.moe.gate.weight is [4, 16], but the model its "
                                                        "metadata.json describes needs [8, 16] (--num-experts 8, "
                                                        "--hidden-size 16)"));
  train::TrainConfig fewer_layers = c;
  fewer_layers.num_layers = 1;
  EXPECT_THAT(error(fewer_layers), ::testing::HasSubstr("tensor layers.1.attn.proj.weight [16, 16] is not a tensor of "
                                                        "the model its metadata.json describes (--num-layers 1, "
                                                        "--hidden-size 16)"));
  train::TrainConfig untied = c;
  untied.untie_embeddings_and_output_weights = true;
  EXPECT_THAT(error(untied), ::testing::HasSubstr("tensor output_layer.weight is missing, but the model its "
                                                  "metadata.json describes has it, shaped [256, 16]"));
  fs::remove_all(dir);
}
