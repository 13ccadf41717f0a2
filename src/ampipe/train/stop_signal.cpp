#include "ampipe/train/stop_signal.h"

#include <signal.h>

#include <atomic>

#include "ampipe/comm/collectives.h"
#include "ampipe/core/error.h"

namespace ampipe::train {

namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");
struct sigaction g_old_term, g_old_int;
bool g_installed = false;

extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  if (!g_signal.compare_exchange_strong(expected, sig) && expected == sig) {
    // The same signal again: the user insists. Default action (terminate) now.
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
}

}  // namespace

StopSignalGuard::StopSignalGuard() {
  AMPIPE_CHECK(!g_installed, "one StopSignalGuard at a time");
  g_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking reads and writes resume; the flag is read at the iteration boundary
  ::sigaction(SIGTERM, &sa, &g_old_term);
  ::sigaction(SIGINT, &sa, &g_old_int);
  g_installed = true;
}

StopSignalGuard::~StopSignalGuard() {
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  ::sigaction(SIGINT, &g_old_int, nullptr);
  g_installed = false;
}

int stop_signal_received() { return g_signal.load(); }

void request_stop(int signal_number) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, signal_number);
}

int stop_agreed(const comm::Group& world) {
  const int mine = g_signal.load();
  if (world.size() == 1) return mine;
  return int(comm::all_reduce_max(world, int64_t(mine), "stop.signal"));
}

std::string signal_name(int signal_number) {
  if (signal_number == SIGTERM) return "SIGTERM";
  if (signal_number == SIGINT) return "SIGINT";
  return "signal " + std::to_string(signal_number);
}

}  // namespace ampipe::train
