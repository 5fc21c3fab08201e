#include "sim/sim_workloads.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace kvtier::bench {
namespace {

// The engine the follow-up times assume (the simulator's defaults).
constexpr double kPrefillTokensPerS = 8000;
constexpr double kDecodeMsPerToken = 20;

struct Request {
  uint64_t conversation;  // the generator's own numbering
  uint64_t arrival_ms;
  uint32_t input_tokens;
  uint32_t output_tokens;
  std::vector<uint64_t> hash_ids;  // full blocks, then one partial block
  RequestPriorities priorities;    // what the engine says with the turn's Save
};

class Generator {
 public:
  Generator(uint64_t seed, uint32_t tokens_per_block) : rng_(seed), tokens_(tokens_per_block) {}

  uint64_t fresh() { return next_id_++; }
  uint64_t uniform(uint64_t lo, uint64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng_);
  }
  double exponential_ms(double mean_ms) {
    return std::exponential_distribution<double>(1.0 / mean_ms)(rng_);
  }
  bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
  template <class Distribution>
  auto draw(Distribution& d) {
    return d(rng_);
  }

  // A request whose full blocks are `prefix`; its last, partial block is fresh.
  Request request(uint64_t conversation, uint64_t arrival_ms, const std::vector<uint64_t>& prefix,
                  uint32_t output) {
    Request r{conversation, arrival_ms, 0, output, prefix, {}};
    const uint32_t partial = static_cast<uint32_t>(uniform(1, tokens_ - 1));
    r.input_tokens = static_cast<uint32_t>(prefix.size()) * tokens_ + partial;
    r.hash_ids.push_back(fresh());
    return r;
  }
  // When the turn after `r` arrives: once `r` is served, plus `think_ms`.
  static uint64_t next_turn_at(const Request& r, double think_ms) {
    const double served =
        r.input_tokens / kPrefillTokensPerS * 1000 + r.output_tokens * kDecodeMsPerToken;
    return r.arrival_ms + static_cast<uint64_t>(served + think_ms);
  }
  void append_fresh(std::vector<uint64_t>& blocks, uint64_t count) {
    for (uint64_t i = 0; i < count; ++i) blocks.push_back(fresh());
  }

  std::vector<Request> requests;

 private:
  std::mt19937_64 rng_;
  uint32_t tokens_;
  uint64_t next_id_ = 0;
};

void long_chats(Generator& g) {
  std::vector<uint64_t> system;
  g.append_fresh(system, 2);
  for (int c = 0; c < 40; ++c) {
    std::vector<uint64_t> blocks = system;
    g.append_fresh(blocks, g.uniform(1, 3));
    uint64_t at = g.uniform(0, 600'000);
    const uint64_t turns = g.uniform(40, 120);
    for (uint64_t t = 0; t < turns; ++t) {
      g.requests.push_back(g.request(c, at, blocks, static_cast<uint32_t>(g.uniform(100, 400))));
      const double think = g.chance(0.1) ? g.exponential_ms(300'000) : g.exponential_ms(15'000);
      at = Generator::next_turn_at(g.requests.back(), think);
      g.append_fresh(blocks, g.uniform(1, 3));
    }
  }
}

void one_shot(Generator& g) {
  std::vector<uint64_t> system;
  g.append_fresh(system, 4);
  double at = 0;
  for (int i = 0; i < 5000; ++i) {
    at += g.exponential_ms(200);  // 5 requests/s
    std::vector<uint64_t> blocks = system;
    g.append_fresh(blocks, g.uniform(1, 16));
    g.requests.push_back(
        g.request(i, static_cast<uint64_t>(at), blocks, static_cast<uint32_t>(g.uniform(50, 300))));
    if (!g.chance(0.15)) continue;
    const uint64_t next = Generator::next_turn_at(g.requests.back(), g.exponential_ms(30'000));
    g.append_fresh(blocks, g.uniform(1, 2));
    g.requests.push_back(g.request(i, next, blocks, static_cast<uint32_t>(g.uniform(50, 300))));
  }
}

void doc_qa(Generator& g) {
  std::vector<uint64_t> system;
  g.append_fresh(system, 1);
  std::vector<std::vector<uint64_t>> documents(40);
  std::vector<double> weights;
  for (size_t d = 0; d < documents.size(); ++d) {
    documents[d] = system;
    g.append_fresh(documents[d], g.uniform(16, 64));
    weights.push_back(1.0 / static_cast<double>(d + 1));  // Zipf, s = 1
  }
  std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
  double at = 0;
  for (int s = 0; s < 2500; ++s) {
    at += g.exponential_ms(400);  // 2.5 sessions/s
    std::vector<uint64_t> blocks = documents[g.draw(pick)];
    g.append_fresh(blocks, 1);  // the question
    uint64_t turn_at = static_cast<uint64_t>(at);
    const uint64_t turns = g.uniform(1, 4);
    for (uint64_t t = 0; t < turns; ++t) {
      g.requests.push_back(
          g.request(s, turn_at, blocks, static_cast<uint32_t>(g.uniform(50, 200))));
      turn_at = Generator::next_turn_at(g.requests.back(), g.exponential_ms(20'000));
      g.append_fresh(blocks, 1);  // the answer and the next question
    }
  }
}

// Retention priorities an engine that knows its requests gives (session_table.h).
constexpr uint8_t kKeep = 90;    // a prompt every task of an agent starts with
constexpr uint8_t kOneOff = 10;  // a failed tool call's output, a batch request

void agents(Generator& g) {
  constexpr uint64_t kSpanMs = 1'200'000;
  std::vector<std::vector<uint64_t>> prompts(8);
  for (auto& prompt : prompts) g.append_fresh(prompt, g.uniform(24, 48));
  double at = 0;
  uint64_t conversation = 0;
  while ((at += g.exponential_ms(4'000)) < kSpanMs) {  // a task every 4 s
    const std::vector<uint64_t>& prompt = prompts[g.uniform(0, prompts.size() - 1)];
    const PriorityRange keep_prompt{0, static_cast<uint32_t>(prompt.size()), kKeep};
    std::vector<uint64_t> blocks = prompt;
    g.append_fresh(blocks, g.uniform(1, 3));  // the task
    uint64_t c = conversation++;
    uint64_t turn_at = static_cast<uint64_t>(at);
    for (uint64_t t = 0, turns = g.uniform(2, 6); t < turns; ++t) {
      g.requests.push_back(
          g.request(c, turn_at, blocks, static_cast<uint32_t>(g.uniform(50, 200))));
      g.requests.back().priorities.blocks = {keep_prompt};
      turn_at = Generator::next_turn_at(g.requests.back(), g.exponential_ms(3'000));  // the tool
      if (g.chance(0.25)) {
        // The tool call failed: the turn that read its output is retried from before it,
        // so those blocks are never read again, and the engine says so.
        std::vector<uint64_t> failed = blocks;
        g.append_fresh(failed, g.uniform(1, 3));
        g.requests.push_back(
            g.request(c, turn_at, failed, static_cast<uint32_t>(g.uniform(20, 80))));
        g.requests.back().priorities.blocks = {
            keep_prompt,
            {static_cast<uint32_t>(blocks.size()),
             static_cast<uint32_t>(failed.size() - blocks.size()), kOneOff}};
        turn_at = Generator::next_turn_at(g.requests.back(), g.exponential_ms(3'000));
        // The retry extends the turn the failed call had already extended: a fork, which
        // a trace without session ids shows as a conversation of its own.
        c = conversation++;
      }
      g.append_fresh(blocks, g.uniform(1, 3));  // the tool's output
    }
  }
  // Beside them, batch requests over documents of their own, never read again.
  at = 0;
  while ((at += g.exponential_ms(500)) < kSpanMs) {  // 2 per second
    std::vector<uint64_t> blocks;
    g.append_fresh(blocks, g.uniform(8, 32));
    g.requests.push_back(g.request(conversation++, static_cast<uint64_t>(at), blocks,
                                   static_cast<uint32_t>(g.uniform(50, 300))));
    g.requests.back().priorities.session = kOneOff;
  }
}

}  // namespace

const std::vector<std::string>& workload_names() {
  static const std::vector<std::string> names = {"long-chats", "one-shot", "doc-qa", "agents"};
  return names;
}

Result<Trace> generate_workload(const std::string& name, uint64_t seed, uint32_t tokens_per_block,
                                std::vector<uint64_t>* conversations) {
  if (tokens_per_block < 2) return invalid_argument("tokens per block must be at least 2");
  Generator g(seed, tokens_per_block);
  if (name == "long-chats") {
    long_chats(g);
  } else if (name == "one-shot") {
    one_shot(g);
  } else if (name == "doc-qa") {
    doc_qa(g);
  } else if (name == "agents") {
    agents(g);
  } else {
    return invalid_argument("unknown workload '{}' (long-chats, one-shot, doc-qa, agents)", name);
  }
  std::stable_sort(g.requests.begin(), g.requests.end(),
                   [](const Request& a, const Request& b) { return a.arrival_ms < b.arrival_ms; });
  TraceBuilder builder(tokens_per_block);
  if (conversations != nullptr) conversations->clear();
  for (const Request& r : g.requests) {
    if (conversations != nullptr) conversations->push_back(r.conversation);
    KVTIER_RETURN_IF_ERROR(
        builder.add(r.arrival_ms, r.input_tokens, r.output_tokens, r.hash_ids, r.priorities));
  }
  return std::move(builder).finish();
}

}  // namespace kvtier::bench
