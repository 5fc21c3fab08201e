// Generated workloads for the policy simulator, so that a policy is judged on more
// than the one shared trace. Each is a shape seen in production, with its constants
// fixed in sim_workloads.cpp (not fitted to any result):
//  * long-chats: few long conversations (40 of 40–120 turns, 1–3 new blocks a turn,
//    think times of ~15 s with occasional breaks of minutes);
//  * one-shot: many one-shot requests behind one shared system prompt (5,000 at 5/s,
//    15 % with one follow-up);
//  * doc-qa: document QA, many sessions over a few long shared documents (2,500
//    sessions on 40 documents of 16–64 blocks, Zipf popularity, 1–4 questions each);
//  * agents: tool-using agents (a task every 4 s for 20 minutes on one of 8 agents
//    whose prompts are 24–48 blocks, 2–6 tool calls of which a quarter fail and are
//    retried) beside one-off batch requests (2/s, 8–32 blocks of their own). The only
//    workload whose requests carry retention priorities, as an engine that knows them
//    would give: agents' prompts 90, failed calls' output and batch requests 10.
// Requests go through the same TraceBuilder as a trace file, so conversations are
// derived the same way. A follow-up arrives after its previous turn has been served
// (prefill at 8,000 tokens/s and 20 ms per output token, the simulator's defaults)
// plus the think time.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "sim/sim_trace.h"

namespace kvtier::bench {

// The generated workloads' names, in report order.
const std::vector<std::string>& workload_names();

// InvalidArgument for an unknown name. `conversations`, when given, receives the
// generator's own conversation of each request (in the trace's order): the truth the
// derived sessions are tested against.
Result<Trace> generate_workload(const std::string& name, uint64_t seed, uint32_t tokens_per_block,
                                std::vector<uint64_t>* conversations = nullptr);

}  // namespace kvtier::bench
