// The control thread as a capability, so that a clang build checks kvtierd's one
// threading rule: the daemon's state belongs to the io_context's thread, and workers
// (Device copies, NVMe, the remote tier, the region worker, the fill thread) only post
// their results back to it. This is the role capability of clang's thread-safety
// documentation and Abseil ("only on the GUI thread"): nothing is locked, and it costs
// nothing at run time.
//
// The rule, as the annotations state it:
//   - Daemon state is KVTIER_GUARDED_BY(control_thread): DaemonContext's fields and the
//     mutable fields of the daemon's parts (daemon/). Classes the simulator and unit tests
//     use on one thread (BlockStore, SessionTable, Planner, MoveExecutor...) carry no
//     annotation: the daemon reaches them only through guarded fields.
//   - A function that touches that state, or calls one that does, is
//     KVTIER_REQUIRES(control_thread), on its declaration.
//   - A function the control thread enters from outside calls assert_control_thread()
//     first: an asio handler, a completion or lambda posted to the io_context, a timer's
//     handler, a signal handler, and the Service's public methods (on_frame and the
//     other ipc::RequestHandler calls, and what main, the harness and the tests call).
//   - A lambda is a function of its own to the analysis, so a lambda that touches
//     control-thread state begins with assert_control_thread(), wherever it is called
//     from: a posted completion, a hook the executor calls, a callback a part runs at
//     once (SessionTable::for_each, a reply's fill). Not KVTIER_REQUIRES on the lambda:
//     clang accepts it, but checks it only at direct calls; a call through
//     std::function is not checked, and one inside an unannotated template
//     (SessionTable::for_each) fails there. The assert is a claim that the lambda runs
//     on the control thread: a lambda that runs on a worker must not make it, and then
//     cannot touch guarded state.
//   - Constructors and destructors are not analysed. One that calls a function that
//     requires the control thread asserts it there, saying why that holds.
//
// assert_control_thread() is taken on trust: it checks nothing at run time. Tests and
// the in-process harness run a Service on threads that never announce themselves (a
// test's own thread before the loop runs, then the loop's), and the daemon's own thread
// is whichever one calls io_context::run(); the check is the compiler's, at each place
// that says where it runs.
#pragma once

#include "common/thread_annotations.h"

namespace kvtier {

class KVTIER_CAPABILITY("control thread") ControlThread {};

// The one control thread: what the daemon's state is guarded by.
inline constexpr ControlThread control_thread{};

// The caller runs on the control thread: from here on the analysis treats the
// capability as held.
inline void assert_control_thread() KVTIER_ASSERT_CAPABILITY(control_thread) {}

}  // namespace kvtier
