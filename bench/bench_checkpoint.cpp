// Save and load time of a `ampipe train` checkpoint (train::save_checkpoint / load_checkpoint through the Trainer),
// for a model whose checkpoint is a few hundred MB: the cost of what a save and a load do besides the disk
// (gathering, packing, checksums, verification on load) next to the write itself.
//
//   ./bench/bench_checkpoint [DIR] [REPS]      (default DIR: a temporary directory; REPS 5)
//
// Model: L=2 blocks, s=128, h=512, F=2048, 4 experts, top-2, byte vocabulary (the bundled corpus): 18.9 M
// parameters, so model.safetensors ~ 76 MB and optimizer.safetensors ~ 151 MB. One rank. Saves and loads are
// interleaved (save, load, save, load, ...) so that a noisy neighbour hits both alike; the median of each is
// printed with the minimum and maximum. No training step runs: the weights are the initial ones (the file sizes
// and the work do not depend on the values).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "ampipe/comm/runtime.h"
#include "ampipe/core/checksum.h"
#include "ampipe/train/text_data.h"
#include "ampipe/train/trainer.h"
#include "ampipe/train/vocab_size.h"

using namespace ampipe;
namespace fs = std::filesystem;

namespace {

train::TrainConfig bench_config() {
  train::TrainConfig c;
  model::LayerConfig& l = c.layer;
  l.seq_length = 128;
  l.micro_batch_size = 1;
  l.hidden_size = 512;
  l.ffn_hidden_size = 2048;
  l.num_attention_heads = 8;
  l.num_experts = 4;
  l.moe_router_topk = 2;
  l.moe_train_capacity_factor = 1.25;
  l.init_method_std = 0.02;
  l.seed = 1234;
  c.num_layers = 2;
  c.train_iters = 10;
  c.lr_warmup_iters = 1;
  c.eval_interval = 0;
  return c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  comm::Runtime rt(&argc, &argv);
  const std::string dir = argc > 1 ? argv[1]
                                   : (fs::temp_directory_path() / ("ampipe_bench_ckpt_" + std::to_string(::getpid())))
                                         .string();
  const int reps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
  const comm::Groups groups = rt.make_groups(comm::Layout::make(1, 1, 1, 1));
  train::TrainConfig save_cfg = bench_config();
  save_cfg.save = dir;
  save_cfg.validate(1);
  const train::Corpus corpus = train::load_corpus("");
  save_cfg.padded_vocab_size = train::pad_vocab_size(corpus.vocab_size, save_cfg.make_vocab_size_divisible_by, 1);
  auto data = std::make_shared<const train::TextData>(corpus, save_cfg.layer.seq_length, save_cfg.valid_fraction,
                                                      save_cfg.layer.seed, "corpus");
  train::Trainer saver(save_cfg, groups, data);
  train::TrainConfig load_cfg = save_cfg;
  load_cfg.save.clear();
  load_cfg.load = dir;
  train::Trainer loader(load_cfg, groups, data);
  int64_t params = 0;
  for (auto& p : saver.model().params()) params += p.param.numel();

  using Clock = std::chrono::steady_clock;
  std::vector<double> save_ms, load_ms;
  uintmax_t bytes = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    saver.save(0);  // iteration 0: no step has run (0 samples consumed, 0 optimizer steps)
    const auto t1 = Clock::now();
    loader.maybe_load();
    const auto t2 = Clock::now();
    save_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    load_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) bytes += e.file_size();
  fmt::print("checkpoint of {:.1f} M parameters, {:.1f} MB on disk, {} repetitions (interleaved)\n",
             double(params) / 1e6, double(bytes) / 1e6, reps);
  fmt::print("save: median {:.1f} ms (min {:.1f}, max {:.1f})\n", median(save_ms),
             *std::min_element(save_ms.begin(), save_ms.end()), *std::max_element(save_ms.begin(), save_ms.end()));
  fmt::print("load: median {:.1f} ms (min {:.1f}, max {:.1f})\n", median(load_ms),
             *std::min_element(load_ms.begin(), load_ms.end()), *std::max_element(load_ms.begin(), load_ms.end()));
  // The checksum alone (core/checksum.h) over as many bytes as the checkpoint: what it adds to a save and a load.
  {
    std::vector<unsigned char> buf(size_t(bytes), 1);
    const auto t0 = Clock::now();
    volatile uint64_t h = core::xxh64(buf.data(), buf.size());
    (void)h;
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    fmt::print("xxh64 of {:.1f} MB: {:.1f} ms ({:.1f} GB/s)\n", double(bytes) / 1e6, ms, double(bytes) / ms / 1e6);
  }
  if (argc <= 1) fs::remove_all(dir);
  return 0;
}
