// Stopping on SIGTERM / SIGINT (Megatron's --exit-signal-handler, on by default in `ampipe train`): the handler
// only records the signal; the training loop asks stop_agreed() at every iteration boundary, which combines the
// ranks' records with one small all-reduce (max of the signal numbers), so every rank stops after the same
// iteration even when only one rank (or only the launcher's process group) got the signal. The loop then saves a
// checkpoint when --save is set and returns; `ampipe train` prints one line and exits with 128 + the signal number.
// A second signal of the same kind while the first is being honoured ends the process at once (the default action).
#pragma once

#include <string>

#include "ampipe/comm/group.h"

namespace ampipe::train {

// Installs the handlers for SIGTERM and SIGINT for its lifetime (restores the previous ones after) and clears any
// earlier request. One at a time.
class StopSignalGuard {
 public:
  StopSignalGuard();
  ~StopSignalGuard();
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;
};

// The signal this process received since the guard was installed (0: none).
int stop_signal_received();
// Records a request as the handler does (tests, and callers that stop for their own reasons).
void request_stop(int signal_number);
// Collective over `world`: the largest signal number any rank received (0: none); every rank gets the same answer.
int stop_agreed(const comm::Group& world);
// "SIGTERM", "SIGINT" or "signal N".
std::string signal_name(int signal_number);

}  // namespace ampipe::train
