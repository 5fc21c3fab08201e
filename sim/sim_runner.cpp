#include "sim/sim_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <numeric>
#include <optional>
#include <queue>
#include <unordered_map>

#include "common/sample_stats.h"
#include "policy/clock.h"
#include "policy/session_table.h"
#include "sim/sim_optimum.h"
#include "sim/sim_store.h"

namespace kvtier::bench {
namespace {

constexpr LayoutKey kLayout{0, 1};

BlockKey key_of(uint64_t hash_id) {
  return SimStore::key_of(hash_id);
}

bool session_aware(SimPolicy policy) {
  return policy == SimPolicy::kSessionAware || policy == SimPolicy::kPredictive;
}

// One run: a policy at a budget over the whole trace.
class Simulation {
 public:
  Simulation(const Trace& trace, const SimConfig& config, const SimBudget& budget, SimPolicy policy)
      : trace_(trace),
        config_(config),
        policy_(policy),
        block_bytes_(config.kv_bytes_per_token * trace.tokens_per_block),
        sessions_(clock_),
        planner_(planner_config(config, policy, trace.tokens_per_block), clock_),
        store_(capacities(budget, policy), config.read_bytes_per_s, block_bytes_,
               trace.distinct_blocks, config.inclusive_nvme) {
    planner_.set_layout_cost(kLayout, {trace.tokens_per_block, config.prefill_tokens_per_s});
    if (policy == SimPolicy::kClairvoyant) clairvoyant_.emplace(trace, store_);
    if (policy::BlockObserver* peer = planner_.observer()) store_.subscribe(*peer);
    save_lowest_ = store_.space(Tier::kRam).capacity_bytes > 0 ? Tier::kRam : Tier::kNvme;
    result_.policy = policy;
    result_.budget = budget.name;
    result_.blocks_requested = trace.blocks_requested;
  }

  SimResult run() {
    const auto started = std::chrono::steady_clock::now();
    struct TurnEnd {
      uint64_t at_ms;
      size_t request;
      bool operator>(const TurnEnd& o) const {
        return at_ms != o.at_ms ? at_ms > o.at_ms : request > o.request;
      }
    };
    std::priority_queue<TurnEnd, std::vector<TurnEnd>, std::greater<>> turn_ends;
    // The engines' prefill slots: when each is free (none: every request starts on
    // arrival), and the requests waiting for one, in arrival order.
    std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<>> slots;
    for (uint32_t i = 0; i < config_.engines; ++i) slots.push(0);
    std::deque<size_t> waiting;
    uint64_t next_tick = config_.plan_interval_ms;
    size_t next_arrival = 0;
    while (next_arrival < trace_.requests.size() || !waiting.empty()) {
      const uint64_t arrival = next_arrival < trace_.requests.size()
                                   ? trace_.requests[next_arrival].arrival_ms
                                   : UINT64_MAX;
      const uint64_t end = turn_ends.empty() ? UINT64_MAX : turn_ends.top().at_ms;
      const uint64_t start = waiting.empty() ? UINT64_MAX
                                             : std::max(trace_.requests[waiting.front()].arrival_ms,
                                                        slots.empty() ? uint64_t{0} : slots.top());
      // The optimum also replans as soon as a move lands (the room it frees is used
      // at once, not at the next tick).
      // So do parked Saves: kvtierd retries them as moves land.
      const uint64_t landing = (clairvoyant_ && clairvoyant_->waiting()) || !parked_.empty()
                                   ? store_.next_landing_ms()
                                   : UINT64_MAX;
      // Equal times: ends of turns, arrivals, starts, then the tick; a landing replans
      // only when it comes strictly first.
      const uint64_t first = std::min({end, arrival, start, next_tick});
      if (landing < first) {
        advance(landing);
        if (clairvoyant_) clairvoyant_->rebalance(landing, config_.plan_interval_ms);
      } else if (end == first) {
        const size_t request = turn_ends.top().request;
        turn_ends.pop();
        end_turn(end, request);
      } else if (arrival == first) {
        arrive(arrival, next_arrival);
        waiting.push_back(next_arrival++);
      } else if (start == first) {
        const size_t request = waiting.front();
        waiting.pop_front();
        if (!slots.empty()) slots.pop();
        const double service_ms = serve(start, request);
        const uint64_t first_token = start + static_cast<uint64_t>(service_ms);
        if (config_.engines > 0) slots.push(first_token);
        const TraceRequest& r = trace_.requests[request];
        turn_ends.push(
            {first_token + static_cast<uint64_t>(r.output_tokens * config_.decode_ms_per_token),
             request});
      } else {
        advance(next_tick);
        if (clairvoyant_) {
          clairvoyant_->rebalance(next_tick, config_.plan_interval_ms);
        } else {
          apply(planner_.plan_demotions(sessions_, store_));
        }
        next_tick += config_.plan_interval_ms;
      }
    }
    finish(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    return result_;
  }

 private:
  static policy::PlannerConfig planner_config(const SimConfig& config, SimPolicy policy,
                                              uint32_t tokens_per_block) {
    policy::PlannerConfig out = config.planner;
    switch (policy) {
      case SimPolicy::kPredictive:
        out.mode = policy::PolicyMode::kPredictive;
        break;
      case SimPolicy::kSessionAware:
        out.mode = policy::PolicyMode::kSessionAware;
        break;
      case SimPolicy::kS3Fifo:
        out.mode = policy::PolicyMode::kS3Fifo;
        break;
      case SimPolicy::kSlru:
        out.mode = policy::PolicyMode::kSlru;
        break;
      case SimPolicy::kArc:
        out.mode = policy::PolicyMode::kArc;
        break;
      case SimPolicy::kTinyLfuLru:
        out.mode = policy::PolicyMode::kTinyLfuLru;
        break;
      case SimPolicy::kWorkloadAware:
        out.mode = policy::PolicyMode::kWorkloadAware;
        break;
      case SimPolicy::kWTinyLfu:
        out.mode = policy::PolicyMode::kWTinyLfu;
        break;
      default:
        out.mode = policy::PolicyMode::kLru;
        break;
    }
    for (size_t t = 0; t < config.read_bytes_per_s.size(); ++t) {
      out.cost.read_bytes_per_s[t] = config.read_bytes_per_s[t];
    }
    out.cost.prefill_tokens_per_s = config.prefill_tokens_per_s;
    out.cost.tokens_per_block = tokens_per_block;
    out.plan_interval_ms = config.plan_interval_ms;
    return out;
  }

  static std::array<uint64_t, kLocalTierCount> capacities(const SimBudget& budget,
                                                          SimPolicy policy) {
    constexpr uint64_t kEndless = uint64_t{1} << 62;
    if (policy == SimPolicy::kInfiniteCache) return {kEndless, 0, 0};
    if (policy == SimPolicy::kInfiniteRam) return {0, kEndless, 0};
    if (policy == SimPolicy::kInfiniteNvme) return {0, 0, kEndless};
    if (policy == SimPolicy::kHbmOnlyLru) return {budget.bytes[0], 0, 0};
    return budget.bytes;
  }

  static std::string session_id(uint32_t session) { return std::to_string(session); }

  void advance(uint64_t now_ms) {
    clock_.set_ms(now_ms);
    store_.set_now(now_ms);
    store_.finish_moves(now_ms);
    resume_parked_saves(now_ms);
  }

  // Arrival: the request is queued for the engine, and a follow-up turn sends
  // BeginTurn (session-aware policies) at once, so what it promotes can move while
  // the request waits.
  void arrive(uint64_t now_ms, size_t index) {
    const TraceRequest& request = trace_.requests[index];
    advance(now_ms);
    policy::Session* session = sessions_.find(kLayout.namespace_id, session_id(request.session));
    if (session != nullptr && session_aware(policy_)) {
      sessions_.record_activity(*session);
      session->turn_begun = true;
      session->turn_begun_ms = now_ms;
      apply(planner_.plan_turn_start(*session, sessions_, store_));
    }
  }

  // The engine takes the request: it loads the leading blocks the daemon holds, then
  // prefills the rest. Returns how long that keeps its prefill slot (load + prefill);
  // the TTFT also counts the wait since arrival.
  double serve(uint64_t now_ms, size_t index) {
    const TraceRequest& request = trace_.requests[index];
    advance(now_ms);
    double load_ms = 0;
    uint32_t loaded = 0;
    std::vector<BlockKey> read_up;  // pinned while the Load runs, as kvtierd pins them
    for (; loaded < request.full_blocks; ++loaded) {
      const BlockKey key = key_of(request.hash_ids[loaded]);
      const Tier tier = store_.read_tier(key, now_ms);
      if (tier == Tier::kNone) break;
      result_.hit_blocks[static_cast<size_t>(tier)] += 1;
      if (policy::BlockObserver* o = planner_.observer()) o->block_loaded(key, loaded, now_ms);
      load_ms += static_cast<double>(block_bytes_) /
                 config_.read_bytes_per_s[static_cast<size_t>(tier)] * 1000.0;
      store_.touch(key, now_ms);
      // (The optimum places blocks itself: it reads them where they are.)
      if (tier == Tier::kNvme && !clairvoyant_ && read_into_ram(key, now_ms)) {
        store_.set_pinned(key, true);
        read_up.push_back(key);
      }
    }
    for (const BlockKey& key : read_up) store_.set_pinned(key, false);
    policy::Session* session = sessions_.find(kLayout.namespace_id, session_id(request.session));
    if (session != nullptr) {
      sessions_.record_activity(*session);  // the Load names it
      if (session->turn_begun) {            // as kvtierd measures the turn lead
        planner_.observe_turn_lead(now_ms - std::min(now_ms, session->turn_begun_ms));
        session->turn_begun = false;
      }
    }
    if (clairvoyant_) clairvoyant_->on_served(index);
    const double missed_tokens = static_cast<double>(request.input_tokens) -
                                 static_cast<double>(loaded) * trace_.tokens_per_block;
    const double service_ms =
        load_ms + std::max(0.0, missed_tokens) / config_.prefill_tokens_per_s * 1000.0;
    const double wait_ms = static_cast<double>(now_ms - request.arrival_ms);
    const double ttft = wait_ms + service_ms;
    waits_.push_back(wait_ms);
    ttfts_.push_back(ttft);
    if (request.follow_up) follow_up_ttfts_.push_back(ttft);
    return service_ms;
  }

  // End of turn: the engine saves the request's full blocks, then the planner runs. A
  // Save that must wait for room parks behind the Saves already waiting (kvtierd's
  // order), and is retried whenever moves land, until save-room-wait-ms has passed.
  void end_turn(uint64_t now_ms, size_t index) {
    advance(now_ms);
    const TraceRequest& request = trace_.requests[index];
    if (clairvoyant_) {
      for (uint32_t k = 0; k < request.full_blocks; ++k) {
        const uint64_t id = request.hash_ids[k];
        if (store_.holds(key_of(id))) {
          store_.touch(key_of(id), now_ms);
          continue;
        }
        result_.bytes_saved += block_bytes_;
        if (clairvoyant_->store(id, now_ms)) continue;
        result_.bytes_saved -= block_bytes_;
        break;  // as for the other policies: a prefix with a hole ends there
      }
      clairvoyant_->rebalance(now_ms, config_.plan_interval_ms);
      return;
    }
    if (parked_.empty() && try_save(index, now_ms)) return;
    parked_.push_back({index, now_ms + kSaveRoomWaitMs});
  }

  // kvtierd retries parked Saves when copies and moves settle; here, whenever time
  // moves on (moves land then). A Save whose wait ran out is refused: nothing of it is
  // stored or recorded.
  void resume_parked_saves(uint64_t now_ms) {
    while (!parked_.empty()) {
      const ParkedSave parked = parked_.front();
      if (now_ms < parked.deadline_ms && !try_save(parked.request, now_ms)) return;
      if (now_ms >= parked.deadline_ms) ++result_.saves_refused;
      parked_.pop_front();
    }
  }

  // The Save of request `index`: false when it parks (what it stored so far is given
  // back, as kvtierd releases a parked Save's reserved slots), else true, the session
  // recorded with what was stored.
  bool try_save(size_t index, uint64_t now_ms) {
    const TraceRequest& request = trace_.requests[index];
    // The Save's new blocks stay pinned until it is recorded: room made for a later
    // block never evicts an earlier one of the same Save (in kvtierd they are reserved
    // slots the planner does not see until the Save's copy commits them).
    // Blocks it finds held are pinned too (kvtierd read-pins them until its reply), so
    // making room never drops the Save's own prefix.
    std::vector<BlockHash> saved;
    std::vector<BlockKey> written, kept;
    for (uint32_t k = 0; k < request.full_blocks; ++k) {
      const BlockKey key = key_of(request.hash_ids[k]);
      if (store_.holds(key)) {
        store_.touch(key, now_ms);
        saved.push_back(key.hash);
        if (!store_.placement(key).movable) continue;  // moving, or pinned already
        store_.set_pinned(key, true);
        kept.push_back(key);
        continue;
      }
      const Stored stored =
          store_new_block(key, now_ms, uint64_t{request.full_blocks - k} * block_bytes_);
      if (stored == Stored::kPark) {
        for (const BlockKey& w : kept) store_.set_pinned(w, false);
        for (const BlockKey& w : written) {
          store_.set_pinned(w, false);
          store_.evict(w, /*given_back=*/true);
        }
        return false;
      }
      if (stored == Stored::kNo) break;  // a prefix with a hole is useless past the hole
      store_.set_pinned(key, true);
      written.push_back(key);
      saved.push_back(key.hash);
    }
    result_.bytes_saved += written.size() * block_bytes_;
    if (policy::BlockObserver* o = planner_.observer()) {
      for (size_t k = 0; k < saved.size(); ++k) {
        o->block_saved({kLayout, saved[k]}, static_cast<uint32_t>(k), now_ms);
      }
    }
    for (const BlockKey& key : written) store_.set_pinned(key, false);
    for (const BlockKey& key : kept) store_.set_pinned(key, false);
    auto created =
        sessions_.get_or_create(kLayout.namespace_id, session_id(request.session), kLayout);
    if (!created.is_ok()) return true;
    policy::Session& session = **created;
    sessions_.record_uses(kLayout, saved);
    for (const BlockHash& hash : sessions_.record_save(session, saved, /*end_of_turn=*/true)) {
      const BlockKey key{kLayout, hash};
      store_.add_ref(key);
      holders_[key].push_back(request.session);
    }
    if (config_.priorities) {  // as kvtierd applies a Save's retention
      if (request.priorities.session != 0) {
        sessions_.set_priority(session, request.priorities.session);
      }
      for (const PriorityRange& range : request.priorities.blocks) {
        const size_t end = std::min<size_t>(range.first + range.count, saved.size());
        for (size_t k = range.first; k < end; ++k) {
          (void)sessions_.set_block_priority({kLayout, saved[k]}, range.priority);
        }
      }
    }
    // As kvtierd does after a Save (prefetch stays with the periodic plans).
    apply(planner_.plan_demotions(sessions_, store_, policy::Planner::PlanKind::kAfterSave));
    return true;
  }

  // As kvtierd's Save (Placement::reserve_block): a new block lands in HBM or RAM. When
  // both are full, RAM's coldest blocks go down to NVMe for the rest of the request
  // (`room_bytes`) and the Save parks until they land; it parks too while blocks are
  // moving out of RAM (room on its way) or into it (then movable). Only when nothing
  // can go down and nothing is moving are blocks evicted, from RAM, then HBM — there
  // only blocks no session holds: a Save never takes HBM from the sessions that still
  // need it, it stores the prefix that fits (kNo ends it). Without RAM (the bounds'
  // single-tier stores) the block goes where there is room, and room is made from the
  // slowest tier first.
  enum class Stored { kYes, kPark, kNo };
  Stored store_new_block(const BlockKey& key, uint64_t now_ms, uint64_t room_bytes) {
    if (store_.insert(key, now_ms, save_lowest_) != Tier::kNone) return Stored::kYes;
    if (save_lowest_ == Tier::kRam && store_.space(Tier::kNvme).capacity_bytes > 0) {
      if (store_.moving_out_of(Tier::kRam) > 0) return Stored::kPark;
      if (room_by_demotion(std::max(room_bytes, block_bytes_), std::nullopt,
                           policy::Room::kDemoteEvictingBelow)) {
        // Demotions onto NVMe copies free their slots at once; writes take a while.
        return store_.insert(key, now_ms, save_lowest_) != Tier::kNone ? Stored::kYes
                                                                       : Stored::kPark;
      }
      if (store_.moving_into(Tier::kRam) > 0) return Stored::kPark;
    }
    for (Tier tier : {Tier::kNvme, Tier::kRam, Tier::kHbm}) {
      if (tier > save_lowest_ || store_.space(tier).capacity_bytes == 0) continue;
      const policy::Room rule = tier == Tier::kHbm && save_lowest_ != Tier::kHbm
                                    ? policy::Room::kEvictUnheld
                                    : policy::Room::kEvict;
      auto moves = planner_.make_room(tier, block_bytes_, sessions_, store_, rule);
      if (moves.empty()) continue;
      apply(moves);
      if (store_.insert(key, now_ms, save_lowest_) != Tier::kNone) return Stored::kYes;
    }
    return Stored::kNo;
  }

  // RAM's coldest blocks down to NVMe, the planner's demoting make_room as kvtierd
  // asks it (the moves land as `apply` says); false when there is no NVMe below RAM
  // or it cannot take them.
  bool room_by_demotion(uint64_t bytes, std::optional<uint64_t> at_once_ms, policy::Room rule) {
    if (save_lowest_ != Tier::kRam || store_.space(Tier::kNvme).capacity_bytes == 0) return false;
    auto moves = planner_.make_room(Tier::kRam, bytes, sessions_, store_, rule);
    if (moves.empty() && bytes > block_bytes_) {
      moves = planner_.make_room(Tier::kRam, block_bytes_, sessions_, store_, rule);
    }
    if (moves.empty()) return false;
    apply(moves, at_once_ms);
    return true;
  }

  // A Load of an NVMe block reads it into RAM (kvtierd's executor: the block then lives
  // in RAM, its NVMe slot kept as a copy), making room there as a Save does. The Load
  // does not wait here: the demotions land at once (their link time charged), and
  // where RAM has no room even so the block is read where it is. (kvtierd's read waits
  // for that room: this is kinder by the demotion's write time, and only then.)
  bool read_into_ram(const BlockKey& key, uint64_t now_ms) {
    if (store_.space(Tier::kRam).capacity_bytes == 0) return false;
    // Already on its way up (a BeginTurn promotion): kvtierd's read waits for that
    // copy rather than make room for another.
    if (!store_.placement(key).movable) return false;
    if (store_.move_now(key, Tier::kRam, now_ms)) return true;
    // A full NVMe evicts nothing for a read (as in kvtierd: it could be a block read).
    return room_by_demotion(block_bytes_, now_ms, policy::Room::kDemote) &&
           store_.move_now(key, Tier::kRam, now_ms);
  }

  // `now_ms`: moves something waits for, made at once (SimStore::move_now); else
  // started, landing when their copies finish.
  void apply(const std::vector<policy::Move>& moves,
             std::optional<uint64_t> now_ms = std::nullopt) {
    for (const policy::Move& move : moves) {
      if (move.kind == policy::MoveKind::kEvict) {
        // As kvtierd's executor: room made by a block with an NVMe copy moves it there.
        if (move.reason == policy::MoveReason::kMakeRoom && store_.has_nvme_copy(move.block) &&
            store_.begin_move(move.block, Tier::kNvme, clock_.now_ms())) {
          continue;
        }
        if (!store_.evict(move.block)) continue;
        ++result_.blocks_evicted;
        if (move.reason == policy::MoveReason::kRecomputeCheaper) ++result_.blocks_dropped;
        cut_sessions_at(move.block);
        continue;
      }
      const bool moved = now_ms ? store_.move_now(move.block, move.to, *now_ms)
                                : store_.begin_move(move.block, move.to, clock_.now_ms());
      if (!moved) continue;
      if (move.kind == policy::MoveKind::kPromote) {
        result_.bytes_promoted += block_bytes_;
        if (move.reason == policy::MoveReason::kPredictedReturn) {
          result_.bytes_prefetched += block_bytes_;
        }
      } else {
        result_.bytes_demoted += block_bytes_;
      }
    }
  }

  // As kvtierd does: a session is a prefix, so an evicted block ends every session
  // holding it there, and those sessions drop their references to the rest.
  void cut_sessions_at(const BlockKey& evicted) {
    auto it = holders_.find(evicted);
    if (it == holders_.end()) return;
    const std::vector<uint32_t> holders = std::move(it->second);
    holders_.erase(it);
    for (uint32_t id : holders) {
      policy::Session* session = sessions_.find(kLayout.namespace_id, session_id(id));
      if (session == nullptr) continue;
      const auto& blocks = session->blocks;
      auto at = std::find(blocks.begin(), blocks.end(), evicted.hash);
      if (at == blocks.end()) continue;
      // The session's prefix ends before the evicted block (through the table, so its
      // reverse index follows); the blocks after it lose this session's reference.
      const std::vector<BlockHash> dropped =
          sessions_.truncate(*session, static_cast<size_t>(at - blocks.begin()));
      for (size_t i = 1; i < dropped.size(); ++i) {
        const BlockKey key{kLayout, dropped[i]};
        store_.drop_ref(key);
        auto& others = holders_[key];
        others.erase(std::remove(others.begin(), others.end(), id), others.end());
        if (others.empty()) holders_.erase(key);
      }
    }
  }

  void finish(double wall_seconds) {
    if (clairvoyant_) {
      result_.bytes_promoted = clairvoyant_->stats().bytes_promoted;
      result_.bytes_demoted = clairvoyant_->stats().bytes_demoted;
      result_.bytes_prefetched = clairvoyant_->stats().bytes_promoted;  // all ahead of a use
      result_.blocks_evicted = clairvoyant_->stats().blocks_evicted;
    }
    // Demotions onto NVMe copies were counted as they were applied; they copied nothing.
    result_.bytes_demoted_onto_copy = store_.demoted_onto_copy_bytes();
    result_.bytes_demoted -= result_.bytes_demoted_onto_copy;
    result_.nvme_written_bytes = store_.nvme_written_bytes();
    result_.turns = ttfts_.size();
    result_.wall_seconds = wall_seconds;
    if (ttfts_.empty()) return;
    result_.ttft_mean_ms =
        std::accumulate(ttfts_.begin(), ttfts_.end(), 0.0) / static_cast<double>(ttfts_.size());
    result_.wait_mean_ms =
        std::accumulate(waits_.begin(), waits_.end(), 0.0) / static_cast<double>(waits_.size());
    std::sort(ttfts_.begin(), ttfts_.end());
    result_.ttft_p50_ms = percentile_of_sorted(ttfts_, 0.50);
    result_.ttft_p90_ms = percentile_of_sorted(ttfts_, 0.90);
    result_.ttft_p99_ms = percentile_of_sorted(ttfts_, 0.99);
    if (!follow_up_ttfts_.empty()) {
      result_.follow_up_ttft_mean_ms =
          std::accumulate(follow_up_ttfts_.begin(), follow_up_ttfts_.end(), 0.0) /
          static_cast<double>(follow_up_ttfts_.size());
    }
  }

  const Trace& trace_;
  const SimConfig& config_;
  const SimPolicy policy_;
  const uint64_t block_bytes_;
  policy::ManualClock clock_{0};
  policy::SessionTable sessions_;
  policy::Planner planner_;
  SimStore store_;
  std::optional<Clairvoyant> clairvoyant_;
  Tier save_lowest_ = Tier::kRam;  // the slowest tier a Save's new block may land in
  struct ParkedSave {
    size_t request;
    uint64_t deadline_ms;
  };
  std::deque<ParkedSave> parked_;  // Saves waiting for room, in arrival order
  // kvtierd's save-room-wait-ms when the published results were made; kvtierd now waits
  // 250 ms and then keeps the prefix that fits (docs/policy.md, "Room for Saves").
  static constexpr uint64_t kSaveRoomWaitMs = 5'000;
  std::unordered_map<BlockKey, std::vector<uint32_t>, BlockKeyHasher> holders_;
  std::vector<double> ttfts_;
  std::vector<double> waits_;
  std::vector<double> follow_up_ttfts_;
  SimResult result_;
};

}  // namespace

std::string sim_policy_label(SimPolicy policy) {
  switch (policy) {
    case SimPolicy::kHbmOnlyLru:
      return "1 hbm-only lru";
    case SimPolicy::kLruTiering:
      return "2 lru tiering";
    case SimPolicy::kSessionAware:
      return "3 session-aware";
    case SimPolicy::kPredictive:
      return "4 predictive";
    case SimPolicy::kInfiniteCache:
      return "ideal (infinite)";
    case SimPolicy::kInfiniteRam:
      return "ideal from RAM";
    case SimPolicy::kInfiniteNvme:
      return "ideal from NVMe";
    case SimPolicy::kClairvoyant:
      return "0 optimum";
    case SimPolicy::kS3Fifo:
      return "s3-fifo";
    case SimPolicy::kSlru:
      return "slru";
    case SimPolicy::kArc:
      return "arc";
    case SimPolicy::kTinyLfuLru:
      return "tinylfu-lru";
    case SimPolicy::kWorkloadAware:
      return "workload-aware";
    case SimPolicy::kWTinyLfu:
      return "w-tinylfu";
  }
  return "?";
}

std::string sim_policy_key(SimPolicy policy) {
  switch (policy) {
    case SimPolicy::kS3Fifo:
      return "s3fifo";
    case SimPolicy::kSlru:
      return "slru";
    case SimPolicy::kArc:
      return "arc";
    case SimPolicy::kTinyLfuLru:
      return "tinylfu";
    case SimPolicy::kWorkloadAware:
      return "workload";
    case SimPolicy::kWTinyLfu:
      return "wtinylfu";
    default:
      return "p" + std::to_string(static_cast<int>(policy));
  }
}

bool sim_policy_is_baseline(SimPolicy policy) {
  switch (policy) {
    case SimPolicy::kLruTiering:
    case SimPolicy::kS3Fifo:
    case SimPolicy::kSlru:
    case SimPolicy::kArc:
    case SimPolicy::kTinyLfuLru:
    case SimPolicy::kWTinyLfu:
    case SimPolicy::kWorkloadAware:
      return true;
    default:
      return false;
  }
}

double SimResult::hit_rate() const {
  const uint64_t hits = std::accumulate(hit_blocks.begin(), hit_blocks.end(), uint64_t{0});
  return blocks_requested ? static_cast<double>(hits) / static_cast<double>(blocks_requested) : 0;
}

double SimResult::hit_rate(Tier tier) const {
  return blocks_requested ? static_cast<double>(hit_blocks[static_cast<size_t>(tier)]) /
                                static_cast<double>(blocks_requested)
                          : 0;
}

uint32_t derived_engines(const Trace& trace, const SimConfig& config) {
  constexpr double kUtilization = 0.8;
  double tokens = 0;
  for (const TraceRequest& r : trace.requests) tokens += r.input_tokens;
  const double span_s = trace.requests.empty()
                            ? 1.0
                            : std::max(1.0, static_cast<double>(trace.requests.back().arrival_ms -
                                                                trace.requests.front().arrival_ms) /
                                                1000.0);
  const double busy = tokens / config.prefill_tokens_per_s / span_s / kUtilization;
  return static_cast<uint32_t>(std::max(1.0, std::ceil(busy)));
}

SimResult simulate(const Trace& trace, const SimConfig& config, const SimBudget& budget,
                   SimPolicy policy) {
  return Simulation(trace, config, budget, policy).run();
}

}  // namespace kvtier::bench
