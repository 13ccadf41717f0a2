#include "ampipe/comm/runtime.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "ampipe/comm/mpi_detail.h"
#include "ampipe/comm/trace.h"
#include "ampipe/core/error.h"

namespace ampipe::comm {

namespace {
Runtime* g_runtime = nullptr;

Lane default_lane_for(GroupKind k) {
  switch (k) {
    case GroupKind::ep: return Lane::ep;
    case GroupKind::tp: return Lane::tp;
    case GroupKind::cp: return Lane::cp;
    default: return Lane::dp;
  }
}

// A group over `comm` (whose ranks are `members`, in order): duplicates one communicator per communication lane
// and a debug one; `comm` itself stays the caller's.
std::shared_ptr<GroupState> new_group(GroupKind kind, std::vector<int> members, MPI_Comm comm, int world_rank,
                                      Engine* engine) {
  AMPIPE_CHECK(!engine->running(),
               "rank {}: groups must be created before the first communication op starts the engine", world_rank);
  auto g = std::make_shared<GroupState>();
  g->kind = kind;
  g->label = group_label(kind, members);
  g->members = std::move(members);
  MPI_Comm_rank(comm, &g->rank);
  int sz = 0;
  MPI_Comm_size(comm, &sz);
  AMPIPE_CHECK(sz == int(g->members.size()), "group {}: communicator size {} vs {} members", g->label, sz,
               g->members.size());
  AMPIPE_CHECK(g->members[size_t(g->rank)] == world_rank, "group {}: rank {} at position {}", g->label, world_rank,
               g->rank);
  g->default_lane = default_lane_for(kind);
  g->comms = std::make_unique<GroupComms>();
  for (Lane l : kCommLanes) {
    MPI_Comm& c = g->comms->lane[size_t(lane_index(l))];
    MPI_Comm_dup(comm, &c);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  }
  MPI_Comm_dup(comm, &g->comms->debug);
  g->engine = engine;
  return g;
}
}  // namespace

std::chrono::milliseconds default_timeout() {
  if (g_runtime == nullptr) return std::chrono::milliseconds(300'000);
  const RuntimeOptions& o = g_runtime->options();
  return g_runtime->in_startup() ? std::min(o.comm_timeout, o.startup_timeout) : o.comm_timeout;
}

const char* default_timeout_flag() {
  if (g_runtime == nullptr) return "--comm-timeout";
  const RuntimeOptions& o = g_runtime->options();
  return g_runtime->in_startup() && o.startup_timeout < o.comm_timeout ? "--startup-timeout" : "--comm-timeout";
}

bool launched_with_peers() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(var); v != nullptr && std::atoi(v) > 1) return true;
  return false;
}

// ---- the control channel (mpi_detail.h) ----

std::string Control::name(int r) const {
  return r >= 0 && size_t(r) < hosts.size() ? fmt::format("rank {} ({})", r, hosts[size_t(r)])
                                            : fmt::format("rank {}", r);
}

std::string Control::encode(const Note& n) {
  // The line is cut to fit one eager message (kMaxControlBytes with the JSON around it).
  std::string m = n.message.size() > 800 ? n.message.substr(0, 800) + " ..." : n.message;
  const nlohmann::json j = {{"k", int(n.kind)}, {"c", n.code}, {"m", m}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Control::Note Control::decode(const std::string& bytes) {
  Note n;
  n.arrived = true;
  n.kind = ExitKind::failed;
  n.code = 1;
  try {
    const nlohmann::json j = nlohmann::json::parse(bytes);
    n.kind = ExitKind(std::clamp(j.at("k").get<int>(), 0, 2));
    n.code = j.at("c").get<int>();
    n.message = j.at("m").get<std::string>();
  } catch (const nlohmann::json::exception&) {
    n.message = "(an unreadable exit note)";
  }
  return n;
}

void Control::send_locked(const std::string& bytes, int peer, int tag) {
  AMPIPE_CHECK(bytes.size() <= kMaxControlBytes, "control message of {} bytes (at most {})", bytes.size(),
               kMaxControlBytes);
  // The buffer must live until the send completes: kept beside the request.
  auto buf = std::make_shared<std::string>(bytes);
  MPI_Request req = MPI_REQUEST_NULL;
  const int rc = MPI_Isend(buf->data(), int(buf->size()), MPI_CHAR, peer, tag, comm, &req);
  AMPIPE_CHECK(rc == MPI_SUCCESS, "rank {}: MPI_Isend on the control channel failed ({})", rank, rc);
  sends.push_back(req);
  send_bufs.push_back(std::move(buf));
}

bool Control::poll_locked() {
  for (;;) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    if (MPI_Improbe(MPI_ANY_SOURCE, kExitTag, comm, &flag, &msg, &st) != MPI_SUCCESS || !flag) break;
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string buf(size_t(std::max(n, 0)), '\0');
    MPI_Mrecv(buf.data(), n, MPI_CHAR, &msg, MPI_STATUS_IGNORE);
    const int src = st.MPI_SOURCE;
    if (src < 0 || src >= size || notes[size_t(src)].arrived) continue;
    notes[size_t(src)] = decode(buf);
    if (first_exit.load() < 0) {
      first_exit_at = std::chrono::steady_clock::now();
      first_exit.store(src);
    }
  }
  // Completed sends are dropped (their buffers with them).
  for (size_t i = 0; i < sends.size();) {
    int done = 0;
    MPI_Test(&sends[i], &done, MPI_STATUS_IGNORE);
    if (done) {
      sends.erase(sends.begin() + long(i));
      send_bufs.erase(send_bufs.begin() + long(i));
    } else {
      ++i;
    }
  }
  return first_exit.load() >= 0;
}

bool Control::poll() {
  std::lock_guard lk(mu);
  return poll_locked();
}

std::string Control::left_line(int peer) {
  Note n;
  {
    std::lock_guard lk(mu);
    n = notes[size_t(peer)];
  }
  switch (n.kind) {
    case ExitKind::ok: return fmt::format("{} has left the job (it ended without an error)", name(peer));
    case ExitKind::failed:
      return n.message.empty() ? fmt::format("{} has left the job (exit code {})", name(peer), n.code)
                               : fmt::format("{} has left the job: {}", name(peer), n.message);
    case ExitKind::stopped: return fmt::format("{} has left the job ({})", name(peer), n.message);
  }
  return name(peer) + " has left the job";
}

Runtime& Runtime::current() {
  AMPIPE_CHECK(g_runtime != nullptr, "no comm::Runtime: construct one in main before using comm");
  return *g_runtime;
}
bool Runtime::exists() { return g_runtime != nullptr; }

Runtime::Runtime(int* argc, char*** argv, RuntimeOptions opts) : opts_(opts) {
  AMPIPE_CHECK(g_runtime == nullptr, "a comm::Runtime already exists");
  int inited = 0;
  MPI_Initialized(&inited);
  AMPIPE_CHECK(!inited, "MPI was initialised before comm::Runtime");
  int provided = 0;
  {
    // MPI_Init waits for every rank of the job: a rank that never starts ampipe (another program, a hang before it
    // joins) would hold it forever. The watchdog ends this process after the start-up timeout with one line, and
    // the launcher then ends the job.
    std::mutex mu;
    std::condition_variable cv;
    bool inited = false;
    const std::chrono::milliseconds bound = opts_.startup_timeout;
    std::thread watchdog([&] {
      std::unique_lock lk(mu);
      if (cv.wait_for(lk, bound, [&] { return inited; })) return;
      const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
      if (r == nullptr) r = std::getenv("PMI_RANK");
      std::fprintf(stderr,
                   "ampipe: error: rank %s: MPI_Init did not complete within %.0f s (--startup-timeout): a rank of "
                   "the job did not start ampipe, or hangs before it joins\n",
                   r != nullptr ? r : "?", double(bound.count()) / 1e3);
      std::fflush(stderr);
      std::_Exit(1);
    });
    MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    {
      std::lock_guard lk(mu);
      inited = true;
    }
    cv.notify_all();
    watchdog.join();
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    throw CommError(fmt::format(
        "MPI_Init_thread granted thread level {} but ampipe needs MPI_THREAD_MULTIPLE ({}): the communication "
        "engine thread calls MPI while the main thread runs; use an MPI built with thread support (OpenMPI 4.1 "
        "and MPICH 4.0 on these machines grant it)", provided, MPI_THREAD_MULTIPLE));
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  engine_ = std::make_unique<Engine>(rank_, EngineOptions{opts_.poll_interval, opts_.lane_depth});
  control_ = std::make_unique<Control>();
  control_->rank = rank_;
  control_->size = size_;
  control_->notes.resize(size_t(size_));
  MPI_Comm_dup(MPI_COMM_WORLD, &control_->comm);
  MPI_Comm_set_errhandler(control_->comm, MPI_ERRORS_RETURN);
  {  // every rank's host, for the lines that name a rank (this gather is also the start-up barrier)
    constexpr int kHost = 256;
    char host[kHost] = {};
    gethostname(host, kHost - 1);
    std::vector<char> all(size_t(kHost) * size_t(size_));
    MPI_Allgather(host, kHost, MPI_CHAR, all.data(), kHost, MPI_CHAR, MPI_COMM_WORLD);
    for (int r = 0; r < size_; ++r) {
      const char* h = all.data() + size_t(r) * kHost;
      control_->hosts.emplace_back(h, strnlen(h, kHost));
    }
  }
  engine_->set_control(control_.get());
  std::vector<int> all(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) all[size_t(r)] = r;
  groups_.push_back(new_group(GroupKind::world, all, MPI_COMM_WORLD, rank_, engine_.get()));
  world_ = Group(groups_.back());
  Trace::set_enabled(opts_.trace);
  Trace::set_origin(std::chrono::steady_clock::now());
  g_runtime = this;
}

Runtime::~Runtime() {
  bool drained = engine_->stop(opts_.comm_timeout);
  if (!drained) {
    std::fprintf(stderr, "rank %d: %zu communication ops still unfinished at shutdown after %lld ms; aborting\n",
                 rank_, engine_->pending(), static_cast<long long>(opts_.comm_timeout.count()));
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  g_runtime = nullptr;
  for (auto& g : groups_) {
    if (!g->comms) continue;
    for (MPI_Comm& c : g->comms->lane)
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    if (g->comms->debug != MPI_COMM_NULL) MPI_Comm_free(&g->comms->debug);
  }
  {
    std::lock_guard lk(control_->mu);
    for (MPI_Request& r : control_->sends) MPI_Request_free(&r);  // eager: delivered or dropped with the job
    control_->sends.clear();
    MPI_Comm_free(&control_->comm);
  }
  MPI_Finalize();
}

void Runtime::set_poll_interval(std::chrono::microseconds us) {
  opts_.poll_interval = us;
  engine_->set_poll_interval(us);
}

std::string Runtime::rank_name(int r) const { return control_->name(r); }

std::vector<std::string> Runtime::agree(const std::string& what, const std::string& mine) {
  if (size_ == 1) return {mine};
  AMPIPE_CHECK(mine.size() <= 1000, "agreement on {}: {} bytes (at most 1000)", what, mine.size());
  Control& c = *control_;
  const int tag = Control::kAgreeTagBase + int(agreements_++ % 1'000'000);
  std::vector<std::string> all(static_cast<size_t>(size_));
  std::vector<char> got(static_cast<size_t>(size_), 0);
  all[size_t(rank_)] = mine;
  got[size_t(rank_)] = 1;
  int missing = size_ - 1;
  {
    std::lock_guard lk(c.mu);
    for (int p = 0; p < size_; ++p)
      if (p != rank_) c.send_locked(mine, p, tag);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + opts_.startup_timeout;
  auto receive = [&] {  // with c.mu held
    for (int p = 0; p < size_; ++p) {
      if (got[size_t(p)]) continue;
      int flag = 0;
      MPI_Message msg;
      MPI_Status st;
      if (MPI_Improbe(p, tag, c.comm, &flag, &msg, &st) != MPI_SUCCESS || !flag) continue;
      int n = 0;
      MPI_Get_count(&st, MPI_CHAR, &n);
      std::string buf(size_t(std::max(n, 0)), '\0');
      MPI_Mrecv(buf.data(), n, MPI_CHAR, &msg, MPI_STATUS_IGNORE);
      all[size_t(p)] = std::move(buf);
      got[size_t(p)] = 1;
      --missing;
    }
  };
  for (;;) {
    bool left = false;
    {
      std::lock_guard lk(c.mu);
      receive();
      if (missing == 0) return all;
      // A peer that has left never arrives; what it sent before its exit note has arrived by now (one source, one
      // communicator: in order), so look once more before concluding.
      left = c.poll_locked();
      if (left) receive();
      if (missing == 0) return all;
    }
    if (left)  // a peer that has left never arrives
      throw PeerStopped(fmt::format("{}, while {} waited for it in the start-up agreement on {}",
                                    c.left_line(c.first_exit.load()), rank_name(rank_), what));
    if (std::chrono::steady_clock::now() > deadline) {
      std::vector<std::string> names;
      for (int p = 0; p < size_; ++p)
        if (!got[size_t(p)]) names.push_back(rank_name(p));
      throw CommError(fmt::format("{}: {} did not reach the start-up agreement on {} within {} s (--startup-timeout "
                                  "{}): it hangs, is stopped, or runs another program",
                                  rank_name(rank_), fmt::join(names, ", "), what,
                                  double(opts_.startup_timeout.count()) / 1e3,
                                  double(opts_.startup_timeout.count()) / 1e3));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Runtime::end_startup() {
  if (!startup_) return;
  agree("the start of the first step (every rank's start-up checks passed)", "");
  startup_ = false;
}

int Runtime::finish(Exit kind, int code, const std::string& message) {
  if (finished_) return code;
  finished_ = true;
  if (size_ == 1) {
    if (!message.empty()) std::fprintf(stderr, "ampipe: error: %s\n", message.c_str());
    std::fflush(stderr);
    return code;
  }
  Control& c = *control_;
  // The engine's ops: after a success they drain (every rank issued them); after a failure they may never
  // complete (this rank left a collective its peers are in), and are abandoned.
  const bool drained = engine_->stop(kind == Exit::ok ? opts_.comm_timeout : std::chrono::milliseconds(2000));
  const bool abandon = !drained || engine_->abandoned_requests();
  Control::Note mine;
  mine.arrived = true;
  mine.kind = kind == Exit::ok ? Control::ExitKind::ok
              : kind == Exit::failed ? Control::ExitKind::failed
                                     : Control::ExitKind::stopped;
  mine.code = code;
  mine.message = message;
  const std::string note = Control::encode(mine);
  {
    std::lock_guard lk(c.mu);
    for (int p = 0; p < size_; ++p)
      if (p != rank_) c.send_locked(note, p, Control::kExitTag);
  }
  // Every peer's note: after a failure within the start-up timeout (a peer still working learns of it at its next
  // wait), after a success within --comm-timeout (the peers' last work before they end).
  const std::chrono::milliseconds bound = kind == Exit::ok ? opts_.comm_timeout : opts_.startup_timeout;
  const auto deadline = std::chrono::steady_clock::now() + bound;
  std::vector<Control::Note> all;
  for (;;) {
    {
      std::lock_guard lk(c.mu);
      c.poll_locked();
      all = c.notes;
    }
    all[size_t(rank_)] = mine;
    if (std::all_of(all.begin(), all.end(), [](const Control::Note& n) { return n.arrived; })) break;
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<std::string> missing;
  int blame = -1, first_present = -1;
  for (int r = 0; r < size_; ++r) {
    const Control::Note& n = all[size_t(r)];
    if (!n.arrived) {
      missing.push_back(rank_name(r));
      continue;
    }
    if (first_present < 0) first_present = r;
  }
  // The rank to blame: the lowest that failed, else the lowest that was stopped (by a peer that left without an
  // error while it waited).
  for (const Control::ExitKind k : {Control::ExitKind::failed, Control::ExitKind::stopped})
    for (int r = 0; r < size_ && blame < 0; ++r)
      if (all[size_t(r)].arrived && all[size_t(r)].kind == k) blame = r;
  // The one line: the failing rank's, naming it and its host; the plain line when every rank failed alike.
  std::string line;
  int printer = -1, out = 0;
  if (blame >= 0) {
    const Control::Note& b = all[size_t(blame)];
    out = b.code != 0 ? b.code : 1;
    printer = blame;
    const bool alike = missing.empty() && std::all_of(all.begin(), all.end(), [&](const Control::Note& n) {
      return n.kind == b.kind && n.message == b.message;
    });
    if (b.message.empty())
      line = "";
    else if (alike || b.kind == Control::ExitKind::stopped)  // a stopped rank's line names the rank that left
      line = b.message;
    else
      line = fmt::format("{}: {}", rank_name(blame), b.message);
    if (alike) printer = 0;
  }
  if (!missing.empty()) {
    if (printer < 0) printer = first_present;
    if (out == 0) out = 1;
    const std::string gone = fmt::format("{} did not answer the exit agreement within {} s: it hangs, is stopped, or "
                                         "has exited without a word; aborting the job",
                                         fmt::join(missing, ", "), double(bound.count()) / 1e3);
    line = line.empty() ? gone : line + "; " + gone;
  }
  if (printer == rank_ && !line.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "ampipe: error: %s\n", line.c_str());
    std::fflush(stderr);
  }
  if (!missing.empty() || abandon) {
    // MPI cannot be finalised: a peer is gone, or this rank's requests were abandoned in flight.
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, out);
    std::_Exit(out);
  }
  return out;
}

Groups Runtime::make_groups(const Layout& layout) {
  AMPIPE_CHECK(layout.world == size_, "layout for world {} on a world of {} ranks", layout.world, size_);
  // Ranks started with different parallel sizes would split the world into groups of different shapes: refused on
  // every rank with one line, in a bounded agreement (the splits below are blocking; every rank reaches them only
  // once every rank has agreed, so none waits there for a rank that failed).
  static constexpr const char* kFlags[4] = {"--tensor-model-parallel-size", "--context-parallel-size",
                                            "--expert-model-parallel-size", "--pipeline-model-parallel-size"};
  const std::vector<std::string> all =
      agree("the parallel layout", fmt::format("{} {} {} {}", layout.tp, layout.cp, layout.ep, layout.pp));
  auto sizes = [](const std::string& s) {
    int v[4] = {0, 0, 0, 0};
    std::sscanf(s.c_str(), "%d %d %d %d", &v[0], &v[1], &v[2], &v[3]);
    return std::array<int, 4>{v[0], v[1], v[2], v[3]};
  };
  const std::array<int, 4> first = sizes(all[0]);
  for (int r = 1; r < size_; ++r) {
    const std::array<int, 4> theirs = sizes(all[size_t(r)]);
    for (int k = 0; k < 4; ++k)
      if (theirs[size_t(k)] != first[size_t(k)])
        throw ConfigError(fmt::format("the ranks were started with different settings: {} (rank 0: {}, rank {}: {}); "
                                      "every rank must get the same flags and --config",
                                      kFlags[k], first[size_t(k)], r, theirs[size_t(k)]));
  }
  Groups out;
  out.layout = layout;
  out.world = world_;
  auto make = [&](GroupKind k) {
    MPI_Comm c;
    MPI_Comm_split(MPI_COMM_WORLD, layout.group_index(k, rank_), layout.position(k, rank_), &c);
    groups_.push_back(new_group(k, layout.members(k, rank_), c, rank_, engine_.get()));
    MPI_Comm_free(&c);
    return Group(groups_.back());
  };
  out.tp = make(GroupKind::tp);
  out.cp = make(GroupKind::cp);
  out.dp = make(GroupKind::dp);
  out.dp_cp = make(GroupKind::dp_cp);
  out.ep = make(GroupKind::ep);
  out.edp = make(GroupKind::edp);
  out.pp = make(GroupKind::pp);
  out.stage = make(GroupKind::stage);
  return out;
}

void Runtime::abort(const std::string& message, int code) {
  const bool named = message.rfind("rank ", 0) == 0 || message.rfind("ampipe: ", 0) == 0;
  std::fprintf(stderr, "%s%s\n", named ? "" : fmt::format("rank {}: ", rank_).c_str(), message.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace ampipe::comm
