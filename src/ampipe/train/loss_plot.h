// The loss curves of a run as a PNG (`ampipe train --loss-plot FILE`, and scripts/run.sh's main job): training loss
// per iteration in blue, validation loss at each evaluation in orange (dots joined by lines), on a light grid of the
// loss range; no text (the log says which colour is which and the range).
#pragma once

#include <string>

#include "ampipe/train/trainer.h"

namespace ampipe::train {

// Writes the plot; returns a one-line description ("iterations 1..300, loss 2.91..5.61"). Throws ConfigError naming
// --loss-plot when the file cannot be written; a run with no iteration writes nothing and says so.
std::string write_loss_plot(const std::string& path, const TrainResult& r);

}  // namespace ampipe::train
