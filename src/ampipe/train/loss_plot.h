// The loss curves of a run as a PNG (`ampipe train --loss-plot FILE`, and scripts/run.sh's main job), drawn with
// cairo (libcairo2-dev; <cairo.h> only in train/loss_plot.cpp): 800 x 500 pixels, the training loss of every
// iteration (blue line) and the validation loss of every evaluation (orange dots joined by lines) against the
// iteration, with tick numbers on both axes, axis labels with units (the loss is the mean token cross-entropy in
// nats), a title naming the model and the parallel layout, a legend and a light grid at the ticks. cairo's PNG
// writer compresses with zlib: a plot is some tens of kB.
#pragma once

#include <string>

#include "ampipe/train/train_config.h"
#include "ampipe/train/trainer.h"

namespace ampipe::train {

// The plot's title for a run of `cfg` on `world` ranks (after validate): the model, then the parallel layout, then
// the AMPipe degree, e.g. "GPT-MoE 2 layers, s 64, h 64, E 4 top-2, fp32 | tp 1 cp 1 ep 2 dp 1 | AMPipe degree 2".
std::string loss_plot_title(const TrainConfig& cfg, int world);

// Writes the plot of `r` with `title` on top (atomically); returns a one-line description ("iterations 1..300,
// loss 2.91..5.61"). Throws ConfigError naming --loss-plot and the path when the file cannot be written; a run
// with no iteration writes nothing and says so.
std::string write_loss_plot(const std::string& path, const TrainResult& r, const std::string& title);

}  // namespace ampipe::train
