# kvtier wire protocol, version 1.
#
# Transport: a Unix stream socket. Each message is one Cap'n Proto message in the
# standard stream framing (segment count − 1, segment sizes, padding, segments). The
# daemon refuses a frame whose header announces more than 64 segments or more than
# 16 MiB before it allocates anything, and closes that connection (framing errors are
# the only errors that close a connection; every other bad request gets an Error reply).
#
# Client → daemon: Request. Daemon → client: Response with the same `id`. Requests may
# be pipelined; replies may come back in any order, so clients match them by `id`.
#
# File descriptors (memfd regions; CUDA VMM shareable handles) travel as
# SCM_RIGHTS ancillary data sent together with the bytes of the frame of the request
# that uses them, at most 250 per sendmsg (Linux takes 253 in one message): a request
# with more sends them in several calls, each with at least one byte of the frame,
# all before its last byte. The daemon queues received descriptors in arrival order and
# each request that declares `fdCount > 0` takes that many from the head of the queue
# (a refused request still takes, and closes, them). More than 1024 descriptors waiting
# unclaimed, or descriptors lost in transit (MSG_CTRUNC), are framing errors.
#
# Ordering contract for GPU regions: the engine's writes to the blocks it names in a
# Save must be complete (stream synchronized) before it sends the Save; after a Load
# reply the restored bytes are in the engine's memory and visible to any later work.
# After a Save reply the engine may reuse the saved blocks.

@0xb7c1f0d2a4e6c891;

$import "/capnp/c++.capnp".namespace("kvtier::wire");

const protocolVersion :UInt32 = 1;  # bumped on any incompatible change

enum ErrorCode {
  ok @0;                 # never sent in an Error; mirrors kvtier::StatusCode numbering
  invalidArgument @1;    # fix the request; the message names the bad field
  notFound @2;           # unknown session / region / layout
  resourceExhausted @3;  # retry later or with a smaller request
  permissionDenied @4;   # not allowed for this peer
  unavailable @5;        # daemon shutting down or peer gone: reconnect
  dataLoss @6;           # bytes gone or corrupt: recompute
  internal @7;           # a bug in the daemon
  notSupported @8;       # this daemon / build does not implement that: do it another way
}

struct Error {
  code @0 :ErrorCode;    # what the caller should do
  message @1 :Text;      # human-readable, names the offending field
  retryable @2 :Bool;    # the same request, unchanged, may succeed later (after a wait or
                         # a reconnect); daemons older than this field always send false
}

enum DeviceKind {
  host @0;               # regions are memfd shared memory
  cuda @1;               # regions are GPU memory (CUDA IPC or VMM handles)
}

# How an engine moves its blocks' bytes (Hello.dataPath); kvtierd copies either way.
enum DataPath {
  planeCopies @0;        # kvtierd copies each plane of each block from the engine's cache
  stagingKernels @1;     # the engine packs blocks into a staging region with GPU kernels
                         # and sends Saves and Loads with `staging` (one copy per block)
  stagingHost @2;        # the same, packed by the engine's CPU (host engines, tests)
}

# Where a staged Save reads and a staged Load writes its blocks: a region the engine
# registered, packed. Staged block i (the i-th of the request's blocks) is at
# offsetBytes + i × rowBytes, where rowBytes is the bytes of the planes the request
# copies (a Save: every plane, blockBytes; a Load: its plane range), those planes
# concatenated in layout order: exactly the bytes kvtierd stores. engineBlockId is
# then ignored. The whole range must lie inside the region (invalidArgument).
struct Staging {
  regionId @0 :UInt32;         # a registered region of this connection
  offsetBytes @1 :UInt64;      # where staged block 0 starts in it
}

struct Plane {
  regionId @0 :UInt32;        # which registered region holds this plane
  offsetBytes @1 :UInt64;     # byte offset of engine block 0's slice in the region
  strideBytes @2 :UInt64;     # bytes between engine block i and i+1 in this plane
  bytesPerBlock @3 :UInt64;   # bytes of one block in this plane
}

struct Layout {
  modelId @0 :Text;            # names the KV's producer, not a path: everything that changes
                               # a token's KV changes it (docs/vllm.md, the model
                               # fingerprint); part of the digest
  numLayers @1 :UInt32;        # transformer layers
  numKvHeads @2 :UInt32;       # KV heads on this rank
  headDim @3 :UInt32;          # elements per head
  dtype @4 :Text;              # "fp16", "bf16", "fp8_e4m3", ...
  tokensPerBlock @5 :UInt32;   # tokens per engine block
  tpRank @6 :UInt32;           # tensor-parallel rank of this engine
  tpSize @7 :UInt32;           # tensor-parallel world size
  numBlocks @8 :UInt64;        # engine blocks in the paged cache (ids are 0..numBlocks-1)
  planes @9 :List(Plane);      # a logical block = these slices concatenated, in order
  extraKey @10 :Text;          # anything else that makes blocks incompatible (LoRA id, ...)
}

struct Hello {
  protocolVersion @0 :UInt32;  # must equal the daemon's protocolVersion
  layout @1 :Layout;           # the KV layout all later block ids refer to
  engineName @2 :Text;         # free text for logs and kvtierctl ("vllm-rank0")
  deviceKind @3 :DeviceKind;   # what kind of regions this engine registers; must match the
                               # daemon's backend (invalidArgument otherwise)
  prefillTokensPerSecond @4 :Float64;  # engine's prefill speed, 0 if unknown (policy input)
  dataPath @5 :DataPath;       # how this engine moves block bytes (logs, kvtierctl, metrics)
}

struct HelloReply {
  protocolVersion @0 :UInt32;  # the daemon's protocol version
  layoutDigest @1 :UInt64;     # digest of the layout; equal digests share blocks
  blockBytes @2 :UInt64;       # bytes of one logical block (sum of plane bytes)
  namespaceName @3 :Text;      # the namespace this connection's blocks live in
  maxBlocksPerRequest @4 :UInt32;  # larger Save/Load/Lookup lists are rejected
  deviceKind @5 :DeviceKind;   # the daemon's backend (host: memfd regions; cuda: GPU regions)
  gpuUuids @6 :List(Text);     # cuda: the GPUs this daemon serves ("GPU-…"); regions name one
  deviceName @7 :Text;         # "host" or the GPU models, for logs
  retentionPriorities @8 :Bool;  # Save's retention fields are honoured (older daemons: false)
  loadPlaneRanges @9 :Bool;    # Load's planeBegin/planeCount are honoured (older daemons:
                               # false, and they copy every plane whatever a Load says)
  staging @10 :Bool;           # Save's and Load's `staging` is honoured (older daemons:
                               # false; they would ignore it: never send it to them)
}

struct RegisterRegion {
  regionId @0 :UInt32;         # the id planes use to name this region; unique per connection
  sizeBytes @1 :UInt64;        # region size; the daemon checks the handle matches it
  kind @2 :RegionKind;         # how the region is shared
  ipcHandle @3 :Data;          # cudaIpcMemHandle_t bytes (64) for kind = cudaIpc
  gpuUuid @4 :Text;            # GPU the region lives on (cuda kinds)
  fdCount @5 :UInt32;          # descriptors attached to this request: 1 for memfd, one per
                               # chunk for cudaVmmFd (at most 1024; the client may spread
                               # them over several sendmsg calls, each ≤ 250, before the
                               # frame's last byte)
  offsetBytes @6 :UInt64;      # cudaIpc: where the region starts, from the base of the
                               # allocation the handle exports (cuMemGetAddressRange);
                               # cudaVmmFd: from the start of the first chunk. 0 for memfd.
                               # offsetBytes + sizeBytes must lie inside the allocation
  chunkBytes @7 :List(UInt64); # cudaVmmFd: size of each chunk (one cuMemCreate handle),
                               # in address order; the daemon maps them back to back in
                               # one reserved range. Each a multiple of the allocation
                               # granularity. Empty for other kinds

  enum RegionKind {
    memfd @0;                  # host shared memory; one fd attached
    cudaIpc @1;                # legacy CUDA IPC handle in ipcHandle
    cudaVmmFd @2;              # CUDA VMM POSIX-fd shareable handle; one fd attached
  }
}

struct RegisterRegionReply {
  regionId @0 :UInt32;         # echoes the request
}

struct UnregisterRegion {      # the engine is about to free (or stop sharing) a region
  regionId @0 :UInt32;         # a region registered on this connection (notFound otherwise);
}                              # later Save/Load fail (invalidArgument) until it is registered
                               # again, which may follow the reply

struct UnregisterRegionReply { # sent only after every daemon copy touching the region
  regionId @0 :UInt32;         # finished and the daemon's mapping of it is closed: the
}                              # engine may free the memory once it has this reply

struct BlockRef {
  hash @0 :Data;               # engine-computed chained prefix hash, 1..32 bytes
  engineBlockId @1 :UInt64;    # block index in the engine's paged cache
}

struct Save {
  sessionId @0 :Text;          # conversation id, 1..256 bytes; created on first Save
  blocks @1 :List(BlockRef);   # the session's blocks in prefix order, to append/refresh
  endOfTurn @2 :Bool;          # true: the turn ended, the session's idle clock starts
  retention @3 :Retention;     # the session's priority (absent or priority 0: unchanged)
  blockRetention @4 :List(BlockRetention);  # priorities of ranges of this Save's blocks
  staging @5 :Staging;         # absent: read each plane from the engine's cache; present:
                               # read the packed blocks from this region (Staging)
}

# How long kvtierd keeps blocks, on TensorRT-LLM's scale: priority 1..100, higher is
# kept longer; 35 for a session or block nobody gave one. Under pressure every policy
# gives up the lowest priority first; above 35 a session is durable (never demoted for
# being idle). After durationMs the priority returns to 35 (a block's: to its session's).
struct Retention {
  priority @0 :UInt8;          # 1..100; 0: not given (Save.retention) / clear (a range)
  durationMs @1 :UInt64;       # how long it holds; 0: until changed
}

struct BlockRetention {
  first @0 :UInt32;            # index into Save.blocks
  count @1 :UInt32;            # blocks from there, >= 1
  retention @2 :Retention;     # overrides the session's for these blocks; later ranges win
}

# stored + deduplicated: the leading blocks of the Save the daemon holds now. Fewer than
# Save.blocks when room ran out: when the tiers a Save lands in are full of blocks that
# sessions hold (and nothing can go down a tier to make room), kvtierd does not evict
# them for this Save; it stores the longest prefix that fits (perhaps none) and the
# session records just that prefix. The engine recomputes the rest at the next turn, as
# for any shorter hit; an engine that splits a turn's Save into several stops at the
# first short reply (the blocks after it would follow a hole).
struct SaveReply {
  stored @0 :UInt32;           # blocks copied in by this request
  deduplicated @1 :UInt32;     # blocks already held (or being stored): nothing copied
}

struct Lookup {
  hashes @0 :List(Data);       # a prefix, in order
}

enum Tier {
  hbm @0;                      # daemon-owned device arena
  ram @1;                      # pinned host pool
  nvme @2;                     # slab files on NVMe
  none @3;                     # not held
  remote @4;                   # Lookup: in the remote tier (a Load reads it into RAM first)
}

struct LookupReply {
  hitCount @0 :UInt32;         # leading hashes held and readable
  tiers @1 :List(Tier);        # tier of each of the first hitCount blocks
}

# A Load may copy only some of each block's planes: Layout.planes[planeBegin ..
# planeBegin + planeCount). An engine that loads layer by layer pipelines one Load per
# range for the same blocks and waits for each reply on its own: the reply of a range
# means that range's bytes are in place, whatever the other Loads are doing. Each Load
# stands alone (its own lookup, its own loadedCount); a block evicted between two of
# them ends the later ones' prefixes earlier, so the engine uses the smallest count.
# Daemons that honour the range say so in HelloReply.loadPlaneRanges; older ones
# ignore the fields and copy every plane.
struct Load {
  sessionId @0 :Text;          # session the load belongs to (empty: no session bookkeeping)
  blocks @1 :List(BlockRef);   # the prefix to restore, in order, into these engine blocks
  planeBegin @2 :UInt32;       # first plane to copy (an index into Layout.planes); must be 0
                               # when planeCount is 0
  planeCount @3 :UInt32;       # planes to copy from planeBegin; 0: every plane (a whole-block
                               # Load, as before these fields). planeBegin + planeCount must
                               # not pass the layout's plane count (invalidArgument)
  staging @4 :Staging;         # absent: write each plane into the engine's cache; present:
                               # write the packed range of each block into this region
}

struct LoadReply {
  loadedCount @0 :UInt32;      # leading blocks restored (their planes in the Load's range);
                               # the prefix ends at the first miss
  stopReason @1 :Error;        # why it ended early (notFound, dataLoss, ...); ok if complete
}

# Tier notices: where this connection's layout's blocks went (a router-facing engine
# keeps its announcements true with them). The first WatchTiers on a connection
# subscribes it: from then on the daemon notes every block of the engine's layout (its
# namespace and layout digest) that enters or leaves one of this node's tiers, keeping
# each block once however often it moved (coalesced). A WatchTiers is answered at once
# when changes are noted, else with the first ones to come (a few milliseconds later, so
# that a planner run's moves go in one answer) or empty after maxWaitMs. One WatchTiers
# may wait per connection. For a connection that does not ask, the daemon notes at most
# max-tier-notices-per-connection blocks; past that it forgets them and says `resync`
# (look up what you announced again) instead of holding its memory or the daemon back.
struct WatchTiers {
  maxWaitMs @0 :UInt32;        # answer empty after this long without a change; at most
                               # 60000 (0: answer at once)
  maxChanges @1 :UInt32;       # changes per answer, at most (0: maxBlocksPerRequest); the
                               # rest wait for the next WatchTiers
}

struct TierChange {
  hash @0 :Data;               # the block (as Save named it)
  tier @1 :Tier;               # its tier now: the fastest of this node's tiers holding it,
                               # or none when this node no longer does (evicted, or left
                               # only in the remote tier)
}

struct WatchTiersReply {
  changes @0 :List(TierChange);  # blocks whose place changed since the last answer
  resync @1 :Bool;             # notices were dropped (too many waited): what the engine
                               # believes of its blocks may be stale; look them up
}

struct BeginTurn {
  sessionId @0 :Text;          # the session whose next turn arrived
}

struct BeginTurnReply {
  knownBlocks @0 :UInt32;      # blocks the session references
  promotedBlocks @1 :UInt32;   # blocks scheduled to move up toward HBM
}

struct CloseSession {
  sessionId @0 :Text;          # drop this session's references
}

struct CloseSessionReply {
  releasedBlocks @0 :UInt32;   # references dropped
}

struct Stats {
  allNamespaces @0 :Bool;      # admin only: include every namespace's sessions
}

struct TierStats {
  tier @0 :Tier;               # which tier
  capacityBytes @1 :UInt64;    # configured budget
  usedBytes @2 :UInt64;        # bytes in allocated slots (copies included)
  blocks @3 :UInt64;           # blocks resident
  copyBytes @4 :UInt64;        # bytes of usedBytes holding copies of blocks that live above (NVMe)
  writtenBytes @5 :UInt64;     # bytes the policy's moves wrote into the tier since start
}

struct StatsReply {
  tiers @0 :List(TierStats);   # one entry per configured tier
  sessionsActive @1 :UInt64;   # sessions in a turn
  sessionsIdle @2 :UInt64;     # sessions between turns
  lookupHits @3 :UInt64;       # blocks found by Lookup/Load (a Load of a plane range counts
                               # only when it starts at plane 0: once per layer-wise load)
  lookupMisses @4 :UInt64;     # blocks asked for and not found (likewise)
  bytesSaved @5 :UInt64;       # engine → daemon bytes
  bytesLoaded @6 :UInt64;      # daemon → engine bytes (those copied: a plane range's)
  bytesDemoted @7 :UInt64;     # bytes moved down a tier
  bytesPromoted @8 :UInt64;    # bytes moved up a tier
  pinnedBlocks @9 :UInt64;     # blocks pinned by in-flight copies
  copiesInFlight @10 :UInt64;  # device copy batches and tier I/O jobs not yet complete
  connections @11 :UInt32;     # connected clients
  blocksEvicted @12 :UInt64;   # blocks dropped to make room
  dataLossBlocks @13 :UInt64;  # blocks dropped because their bytes were corrupt or lost
  deviceName @14 :Text;        # "host" or the GPU model
  uptimeMs @15 :UInt64;        # since the daemon started
  adminPinnedBlocks @16 :UInt64;  # blocks held in place by admin pins (not in pinnedBlocks)
  pinnedSessions @17 :UInt32;  # sessions an admin pinned
  recentMoves @18 :List(PlannerMoves);  # the planner's latest decisions, oldest first
  policy @19 :Text;            # placement policy: "lru", "session", "predictive", or a
                               # peer's: "s3fifo", "slru", "arc", "tinylfu-lru", "workload"
  gpus @20 :List(GpuStats);    # cuda backend: each served GPU's part of the HBM arena
  starting @21 :Bool;          # the memory pools are still being filled: Save, Load,
                               # BeginTurn and Drain wait (up to startup-wait-ms)
  fillBytes @22 :UInt64;       # while starting: bytes of memory pools being filled
  remote @23 :RemoteStats;     # the remote tier (configured false without remote-nodes)
  nvme @24 :NvmeStats;         # the NVMe tier's health (configured false without one)
  tenants @25 :List(TenantUsage);  # tenants (namespaces) holding blocks, by name: an admin
                               # sees every tenant, an engine its own
  partialSaves @26 :UInt64;    # Saves that stored only a prefix: the tiers a Save lands in
                               # were full of blocks sessions hold (SaveReply)
  blocksNotSaved @27 :UInt64;  # the blocks past those prefixes, left for engines to recompute
  engines @28 :List(EngineInfo);  # connected engines (Hello done): an admin sees every one,
                               # an engine those of its namespace
}

struct EngineInfo {
  engineName @0 :Text;         # Hello.engineName
  pid @1 :UInt32;              # the engine process (from the socket's credentials)
  namespaceName @2 :Text;      # its namespace
  modelId @3 :Text;            # Layout.modelId: what its blocks are keyed by
  layoutDigest @4 :UInt64;     # the layout its blocks belong to
  tpRank @5 :UInt32;           # Layout.tpRank
  tpSize @6 :UInt32;           # Layout.tpSize
  dataPath @7 :DataPath;       # Hello.dataPath
}

struct TenantUsage {
  tenant @0 :Text;             # the namespace name
  usedBytes @1 :List(UInt64);  # indexed by Tier: hbm, ram, nvme (copies not counted)
  quotaBytes @2 :List(UInt64); # likewise: its tenant-quota there; 0xFFFFFFFFFFFFFFFF: none
}

struct NvmeStats {
  configured @0 :Bool;         # the daemon has an NVMe tier
  degraded @1 :Bool;           # read-only after a write failed, until it heals: demotions and
                               # Saves skip it, Loads still read it
  reason @2 :Text;             # while degraded: why (the latest failed try at healing)
  degradedMs @3 :UInt64;       # while degraded: for how long
  degradations @4 :UInt64;     # times it degraded since start
  heals @5 :UInt64;            # times it healed (took writes again) since start
  healAttempts @6 :UInt64;     # tries at healing since start, failed ones included
}

struct RemoteStats {
  configured @0 :Bool;         # remote-nodes is set
  connected @1 :Bool;          # the daemon has a slot map of the cluster
  degraded @2 :Bool;           # a node it needed was down or answered errors (last call)
  masters @3 :UInt32;          # masters in the slot map
  storedBytes @4 :UInt64;      # bytes this node keeps stored there (remote-bytes budget)
  budgetBytes @5 :UInt64;      # remote-bytes
  inFlightBytes @6 :UInt64;    # payload bytes queued or moving
  writeLagMs @7 :UInt64;       # how long the oldest pending write-behind has waited
  writtenBlocks @8 :UInt64;    # blocks written behind since start
  fetchedBlocks @9 :UInt64;    # blocks read into RAM since start
  lookupHits @10 :UInt64;      # blocks Lookups found only there
  corruptValues @11 :UInt64;   # values that did not verify (deleted, never served)
  errors @12 :UInt64;          # commands a node did not answer or refused
  resumedSessions @13 :UInt64; # sessions BeginTurn created from a remote record
  deferredBlocks @14 :UInt64;  # blocks held here not written behind (GPU memory, NVMe)
  spilledBlocks @15 :UInt64;   # NVMe evictions written there on their way out
  spillUnwritten @16 :UInt64;  # NVMe evictions it lacks that were not written (bound, faults)
}

struct GpuStats {
  uuid @0 :Text;               # "GPU-…", as in HelloReply.gpuUuids
  name @1 :Text;               # the GPU model
  hbmCapacityBytes @2 :UInt64; # its part of the arena
  hbmUsedBytes @3 :UInt64;     # bytes in allocated slots of that part
}

enum MoveKind {
  demote @0;                   # to a slower tier
  promote @1;                  # to a faster tier
  evict @2;                    # dropped from the daemon
}

struct PlannerMoves {          # the moves of one kind one plan decided, summed
  agoMs @0 :UInt64;            # how long before this reply the plan ran
  kind @1 :MoveKind;           # what was done
  fromTier @2 :Tier;           # where the blocks were
  toTier @3 :Tier;             # where they go (none for evict)
  reason @4 :Text;             # "idle", "watermark", "make-room", "recompute-cheaper",
                               # "turn-start" or "predicted-return"
  blocks @5 :UInt32;           # how many blocks
  bytes @6 :UInt64;            # their bytes
}

struct ListSessions {
  allNamespaces @0 :Bool;      # admin only: every namespace, else the caller's
  # One page at a time, so a listing never holds the daemon for long: at most `limit`
  # sessions (0: 1000; at most 10000), in `sortBy` order, after the session `after` names
  # (the previous page's `next`; empty: from the start). A listing is not a snapshot: a
  # session that turns active or idle between pages may move in the order.
  limit @1 :UInt32;
  sortBy @2 :SessionOrder;
  after @3 :Data;
}

enum SessionOrder {
  idle @0;                     # longest idle first (least recently active)
  bytes @1;                    # most bytes referenced first (blocks × block size)
}

struct SessionInfo {
  sessionId @0 :Text;          # as the engine named it
  namespaceName @1 :Text;      # owner namespace
  state @2 :SessionState;      # lifecycle state
  idleMs @3 :UInt64;           # since the last turn ended (0 while active)
  turns @4 :UInt32;            # turns ended so far
  blocks @5 :UInt32;           # blocks referenced
  blocksPerTier @6 :List(UInt32);  # indexed by Tier: hbm, ram, nvme, none
  layoutDigest @7 :UInt64;     # layout the session's blocks belong to
  bytes @8 :UInt64;            # bytes of the session's blocks that are held (any tier)
  pinned @9 :Bool;             # an admin pinned it (kvtierctl pin): never demoted or evicted
  returnProbability @10 :Float64;  # P(it comes back at all), learned online; 1 while active
  returnInMs @11 :UInt64;      # median time from now to its next turn, if it comes back
                               # (0 while active; 2^64-1 when not expected back)
  priority @12 :UInt8;         # retention priority, 1..100 (35 unless an engine set one)
  priorityRemainingMs @13 :UInt64;  # until it returns to 35; 0: no end
}

enum SessionState {
  active @0;                   # a turn is in progress
  idle @1;                     # between turns
}

struct ListSessionsReply {
  sessions @0 :List(SessionInfo);  # in the order asked for
  next @1 :Data;                   # pass as `after` for the next page; empty: this was the last
  total @2 :UInt32;                # sessions the listing covers, all pages together
}

# ---- Operator requests (kvtierctl). Admin ones need uid 0 or the admin group; the
# refusal is permissionDenied and says so. None needs Hello.

struct GetSession {
  sessionId @0 :Text;          # the session to describe
  namespaceName @1 :Text;      # admin only: another namespace (empty: the caller's)
}

struct GetSessionReply {
  session @0 :SessionInfo;     # as ListSessions describes it
}

struct Evict {                 # admin: drop sessions and free their blocks
  sessionId @0 :Text;          # this session (empty: every session idle over idleOverMs)
  namespaceName @1 :Text;      # its namespace; empty: wherever the id is (must be unambiguous)
  idleOverMs @2 :UInt64;       # with no sessionId: sessions idle longer than this (> 0)
}

struct EvictReply {
  sessions @0 :UInt32;         # sessions removed
  blocksEvicted @1 :UInt64;    # blocks dropped from every tier
  bytesFreed @2 :UInt64;       # bytes those blocks occupied (with their NVMe copies)
  blocksKept @3 :UInt64;       # blocks left because another session shares them or a copy
                               # is reading them (they are no longer the session's)
}

struct Pin {                   # admin: keep a session's blocks where they are
  sessionId @0 :Text;          # the session
  namespaceName @1 :Text;      # its namespace; empty: wherever the id is (must be unambiguous)
  pinned @2 :Bool;             # true: pin (blocks saved later are pinned too); false: unpin
}

struct PinReply {
  pinnedBlocks @0 :UInt32;     # the session's blocks the pin holds now (0 after unpin)
}

struct Drain {                 # admin: push every RAM/HBM block down to NVMe (maintenance)
}

struct DrainReply {
  blocksQueued @0 :UInt64;     # blocks whose move to NVMe started (or that moved onto their NVMe copy)
  bytesQueued @1 :UInt64;      # their bytes
}

struct GetConfig {             # admin: the daemon's effective configuration
}

struct ConfigEntry {
  key @0 :Text;                # setting name, as in kvtierd.toml and --flags
  value @1 :Text;              # its value as TOML ("\"4GiB\"", "0.9")
  reloadable @2 :Bool;         # SIGHUP applies changes (others need a restart)
}

struct GetConfigReply {
  entries @0 :List(ConfigEntry);  # every setting, in kvtierd --help order
}

struct Request {
  id @0 :UInt64;               # chosen by the client; echoed in the Response
  union {
    hello @1 :Hello;                      # must come first on a connection
    registerRegion @2 :RegisterRegion;    # share engine memory
    save @3 :Save;                        # copy blocks in
    lookup @4 :Lookup;                    # how much of a prefix is held
    load @5 :Load;                        # copy blocks out
    beginTurn @6 :BeginTurn;              # a session's next turn arrived
    closeSession @7 :CloseSession;        # drop a session
    stats @8 :Stats;                      # counters (no Hello needed)
    listSessions @9 :ListSessions;        # session table (no Hello needed)
    getSession @10 :GetSession;           # one session (no Hello needed)
    evict @11 :Evict;                     # admin
    pin @12 :Pin;                         # admin
    drain @13 :Drain;                     # admin
    getConfig @14 :GetConfig;             # admin
    unregisterRegion @15 :UnregisterRegion;  # stop sharing a region (reply: safe to free)
    watchTiers @16 :WatchTiers;           # tier notices of this layout's blocks (long poll)
  }
}

struct Response {
  id @0 :UInt64;               # the Request's id (0 when the request could not be parsed)
  union {
    error @1 :Error;                          # the request failed
    hello @2 :HelloReply;
    registerRegion @3 :RegisterRegionReply;
    save @4 :SaveReply;
    lookup @5 :LookupReply;
    load @6 :LoadReply;
    beginTurn @7 :BeginTurnReply;
    closeSession @8 :CloseSessionReply;
    stats @9 :StatsReply;
    listSessions @10 :ListSessionsReply;
    getSession @11 :GetSessionReply;
    evict @12 :EvictReply;
    pin @13 :PinReply;
    drain @14 :DrainReply;
    getConfig @15 :GetConfigReply;
    unregisterRegion @16 :UnregisterRegionReply;
    watchTiers @17 :WatchTiersReply;
  }
}
