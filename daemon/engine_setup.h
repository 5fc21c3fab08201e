// EngineSetup: an engine's Hello (its layout and the namespace it lands in) and its
// regions: RegisterRegion (check the request, open the memory) and UnregisterRegion,
// whose reply waits until the daemon's mapping is closed.
//
// Opening and closing run on the region worker (region_worker.h), never on the control
// thread: mapping a multi-GiB memfd with MAP_POPULATE, or importing hundreds of VMM
// chunks, takes long enough to stall every other engine. The request is checked here;
// the worker opens the memory and posts the result back, and the reply goes out from
// here. Until then the connection's later requests wait behind it (startup_gate.h: a
// connection's requests take effect in the order sent), so a Save naming a region
// still opening sees it opened (or the open's error on the RegisterRegion first).
//
// A mapping closes when the region's last shared_ptr goes. The connection's
// EngineContext holds one, and every CopyBatch that touches the region holds one until
// the device is done with it; devices drop those before they call `done`
// (device/device.h). So an Unregister takes the region out of its connection at once (no
// later request can name it) and, while copies still hold it, parks the daemon's own
// reference; every copy completion on the control thread looks again, and the reply
// goes out when the parked reference is the last one, right after it was dropped on
// the region worker.
//
// Thread-safety: control thread only (daemon_context.h); the region worker only opens
// and closes memory and posts back.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "daemon/daemon_context.h"
#include "daemon/requests.h"

namespace kvtier::daemon {

class RegionWorker;  // region_worker.h

class StartupGate;  // startup_gate.h

class EngineSetup final : public Part {
 public:
  // `startup`: a Hello's later requests wait for it there.
  EngineSetup(DaemonContext& ctx, Replies& replies, StartupGate& startup);
  ~EngineSetup();

  Status handle_hello(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                      HelloRequest hello) KVTIER_REQUIRES(control_thread);
  Status handle_register_region(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                uint32_t region_id, RegionHandle region)
      KVTIER_REQUIRES(control_thread);
  // Replies once the daemon's mapping of the region is closed: at once when no copy
  // holds it, else when the last copy that does has completed.
  Status handle_unregister_region(const ConnectionPtr& c, EngineContext& engine, uint64_t id,
                                  uint32_t region_id) KVTIER_REQUIRES(control_thread);
  // Runs after every copy completion: replies to the Unregisters whose region is no
  // longer held by any copy.
  void reply_to_finished_unregisters() KVTIER_REQUIRES(control_thread);
  // The connection closed: its regions (and those its parked Unregisters hold) are
  // closed on the region worker; nobody is told.
  void forget(const ConnectionPtr& connection, EngineContext* engine)
      KVTIER_REQUIRES(control_thread);
  // Runs the closes still queued and stops the worker (the Service's destructor).
  void stop_worker() KVTIER_REQUIRES(control_thread);

 private:
  // Hands a region's last daemon reference to the region worker, which closes the
  // mapping there; `closed` then runs on the control thread.
  void close_region_off_thread(std::shared_ptr<Memory> memory, std::function<void()> closed = {})
      KVTIER_REQUIRES(control_thread);
  void finish_register_region(const ConnectionPtr& c, uint64_t id, uint32_t region_id,
                              int gpu_index, Result<std::shared_ptr<Memory>> memory)
      KVTIER_REQUIRES(control_thread);

  StartupGate& startup_;
  // Two threads: closing one engine's big region does not hold up opening another's.
  std::unique_ptr<RegionWorker> region_worker_ KVTIER_GUARDED_BY(control_thread);
  // Unregisters waiting for copies that still use their region; the entry holds the
  // daemon's last reference, dropped (closing the mapping) just before the reply.
  struct ParkedUnregister {
    std::shared_ptr<Memory> memory;
    ConnectionPtr connection;
    uint64_t request_id;
    uint32_t region_id;
  };
  std::vector<ParkedUnregister> parked_unregisters_ KVTIER_GUARDED_BY(control_thread);
};

}  // namespace kvtier::daemon
