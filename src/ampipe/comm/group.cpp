#include "ampipe/comm/group.h"

#include "ampipe/comm/mpi_detail.h"

namespace ampipe::comm {

GroupState::GroupState() = default;
GroupState::~GroupState() = default;

const Group& Groups::get(GroupKind k) const {
  switch (k) {
    case GroupKind::world: return world;
    case GroupKind::tp: return tp;
    case GroupKind::cp: return cp;
    case GroupKind::dp: return dp;
    case GroupKind::dp_cp: return dp_cp;
    case GroupKind::ep: return ep;
    case GroupKind::edp: return edp;
    case GroupKind::pp: return pp;
    case GroupKind::stage: return stage;
  }
  return world;
}

}  // namespace ampipe::comm
