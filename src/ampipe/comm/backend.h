// comm::Backend: how a Plan's collective moves its bytes. The executor (schedule/) issues every collective through
// one, never through MPI or a copy of its own: MpiBackend runs it on a process group (collectives.h, the engine
// thread), LocalBackend on a group of one rank, where every collective is a copy made on the calling thread. A
// device backend (NCCL, HCCL) is another implementation of this interface in new files (docs/design.md, "The
// device seam").
//
// The calling thread gives a backend its chances to progress: poll() before each compute task, prepare_wait(e)
// before it waits on an Event the backend returned, drain() before the buffers are reused.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ampipe/comm/collectives.h"
#include "ampipe/comm/event.h"
#include "ampipe/comm/group.h"
#include "ampipe/core/tensor.h"

namespace ampipe::comm {

// What a collective does with send and recv over a group of g ranks: all_to_all (equal blocks, block j of send to
// group rank j), all_gather (recv = every rank's send), reduce_scatter (sum; this rank's block), all_reduce (sum,
// in place on recv), send_recv (a ring step: send to rank r+1, recv from r-1).
enum class CollKind : uint8_t { all_to_all, all_gather, reduce_scatter, all_reduce, send_recv };
const char* coll_kind_name(CollKind k);

class Backend {
 public:
  virtual ~Backend() = default;
  // Issues `kind` of send -> recv; it starts once `how.after` is complete. Never blocks on communication.
  virtual Event issue(CollKind kind, const Tensor& send, const Tensor& recv, const std::string& tag,
                      Issue how) = 0;
  virtual void poll() {}
  virtual void prepare_wait(const Event& e) { (void)e; }
  virtual void drain() {}
};

// A process group's collectives, posted to the communication engine (comm/collectives.h).
class MpiBackend final : public Backend {
 public:
  explicit MpiBackend(const Group& g) : g_(g) {}
  Event issue(CollKind kind, const Tensor& send, const Tensor& recv, const std::string& tag, Issue how) override;

 private:
  const Group& g_;
};

// One rank: every collective's result is its input (a copy; all_reduce nothing). A copy whose `after` events are
// complete is made at once; otherwise it is deferred (the returned Event completes when poll(), prepare_wait or
// drain makes it), so a one-rank collective behind a producer on another lane never blocks the caller early.
class LocalBackend final : public Backend {
 public:
  Event issue(CollKind kind, const Tensor& send, const Tensor& recv, const std::string& tag, Issue how) override;
  void poll() override;                         // makes every deferred copy whose producers are done
  void prepare_wait(const Event& e) override;   // the deferred copy `e` stands for, made now
  void drain() override;                        // every deferred copy, made now

 private:
  struct Deferred {
    CollKind kind;
    Tensor send, recv;
    std::vector<Event> after;
    std::shared_ptr<EventState> state;
    std::string tag;
  };
  void finish(Deferred& d);  // waits for its `after` events, makes the copy, completes its event
  std::vector<Deferred> deferred_;
};

}  // namespace ampipe::comm
