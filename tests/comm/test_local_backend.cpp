// comm::LocalBackend, the one-rank backend the executor issues collectives of a one-rank group through: every
// collective is a copy (all_reduce: nothing), made at once when its producers are done, else deferred until
// poll() finds them done, prepare_wait(e) needs it, or drain(); a failed producer's error reaches the caller.
#include <gtest/gtest.h>

#include <memory>

#include "ampipe/comm/backend.h"

using namespace ampipe;
using namespace ampipe::comm;

namespace {

Tensor filled(float v) {
  Tensor t = Tensor::empty({8});
  t.fill(v);
  return t;
}

// An operation on another lane still in flight: an Event that completes when the test says so.
std::shared_ptr<EventState> pending() { return std::make_shared<EventState>(); }

}  // namespace

TEST(LocalBackend, CopiesAtOnceWhenProducersAreDone) {
  LocalBackend b;
  Tensor send = filled(3), recv = filled(0);
  const Event e = b.issue(CollKind::all_to_all, send, recv, "t", {});
  EXPECT_TRUE(e.ready());
  EXPECT_EQ(recv.get(7), 3.0f);
  Tensor data = filled(5);  // all_reduce over one rank: in place, nothing to do
  EXPECT_TRUE(b.issue(CollKind::all_reduce, data, data, "r", {}).ready());
  EXPECT_EQ(data.get(0), 5.0f);
}

TEST(LocalBackend, DefersBehindAProducerUntilPollFindsItDone) {
  LocalBackend b;
  Tensor send = filled(2), recv = filled(0);
  auto producer = pending();
  Issue how;
  how.after = {Event(producer)};
  const Event e = b.issue(CollKind::all_gather, send, recv, "t", how);
  EXPECT_FALSE(e.ready());
  b.poll();  // the producer still runs: nothing copied
  EXPECT_FALSE(e.ready());
  EXPECT_EQ(recv.get(0), 0.0f);
  producer->complete();
  b.poll();
  EXPECT_TRUE(e.ready());
  EXPECT_EQ(recv.get(0), 2.0f);
}

TEST(LocalBackend, PrepareWaitAndDrainMakeTheDeferredCopies) {
  LocalBackend b;
  Tensor s1 = filled(1), r1 = filled(0), s2 = filled(2), r2 = filled(0);
  auto p1 = pending(), p2 = pending();
  Issue h1, h2;
  h1.after = {Event(p1)};
  h2.after = {Event(p2)};
  const Event e1 = b.issue(CollKind::reduce_scatter, s1, r1, "one", h1);
  const Event e2 = b.issue(CollKind::send_recv, s2, r2, "two", h2);
  p1->complete();
  b.prepare_wait(e1);  // this one only
  EXPECT_TRUE(e1.ready());
  EXPECT_EQ(r1.get(3), 1.0f);
  EXPECT_FALSE(e2.ready());
  p2->complete();
  b.drain();
  EXPECT_TRUE(e2.ready());
  EXPECT_EQ(r2.get(3), 2.0f);
}

TEST(LocalBackend, AFailedProducerFailsTheCopyAndSizesMustMatch) {
  LocalBackend b;
  Tensor send = filled(1), recv = filled(0);
  auto producer = pending();
  producer->fail("the producer failed");
  Issue how;
  how.after = {Event(producer)};
  EXPECT_THROW(b.issue(CollKind::all_to_all, send, recv, "t", how), std::exception);
  EXPECT_EQ(recv.get(0), 0.0f);
}
