// What each compute stage reads and writes, by buffer (docs/plan.md, "Stage inputs and outputs"): one table for
// every stage of the blocks, in both directions, as a function of the layout (LayerDims). Together with the seams
// (seams.h: what the collectives between the stages move) it is the data flow of a layer step: a reader, the Plan
// printer and the tests learn from it which stage produces what another consumes, without reading the blocks.
// The tests run every layer with AMPIPE_CHECK_STAGE_IO=1, under which a stage that takes a buffer outside its
// table stops (LayerMemory::enter_stage), so the table cannot drift from the code.
#pragma once

#include <vector>

#include "ampipe/model/buffers.h"
#include "ampipe/model/layer_dims.h"
#include "ampipe/model/stage.h"

namespace ampipe::model {

struct StageIO {
  std::vector<Buf> reads, writes;  // a buffer updated in place (an accumulated gradient) is in both
};

StageIO stage_io(const LayerDims& d, Stage s, Dir dir);

// AMPIPE_CHECK_STAGE_IO=1 in the environment (read once).
bool stage_io_checking();

}  // namespace ampipe::model
