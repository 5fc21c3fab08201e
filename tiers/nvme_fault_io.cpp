// FaultInjectingSlabIo and the parser of its fault specs.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>

#include "tiers/nvme_io.h"

namespace kvtier {
namespace {

Result<int> parse_errno(const std::string& text, const std::string& spec) {
  static const std::map<std::string, int> kNames = {
      {"ENOSPC", ENOSPC}, {"EIO", EIO},       {"EDQUOT", EDQUOT}, {"EROFS", EROFS},
      {"ENOMEM", ENOMEM}, {"EAGAIN", EAGAIN}, {"EBADF", EBADF},   {"EINVAL", EINVAL}};
  if (auto it = kNames.find(text); it != kNames.end()) return it->second;
  char* end = nullptr;
  long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value <= 0 || value > 4095) {
    return invalid_argument("fault '{}': '{}' is not an errno name (ENOSPC, EIO, ...) or number",
                            spec, text);
  }
  return static_cast<int>(value);
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t at = text.find(separator, start);
    parts.push_back(text.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return parts;
    start = at + 1;
  }
}

}  // namespace

Result<SlabIoFault> parse_slab_io_fault(const std::string& spec) {
  static const std::map<std::string, std::pair<SlabIoFault::Kind, bool>> kKinds = {
      {"write", {SlabIoFault::Kind::kWrite, true}},
      {"read", {SlabIoFault::Kind::kRead, true}},
      {"shortread", {SlabIoFault::Kind::kShortRead, false}},
      {"flip", {SlabIoFault::Kind::kFlip, false}},
      {"sync", {SlabIoFault::Kind::kSync, true}},
      {"index", {SlabIoFault::Kind::kIndex, true}}};
  const std::vector<std::string> parts = split(spec, ':');
  auto kind = kKinds.find(parts[0]);
  if (kind == kKinds.end()) {
    return invalid_argument("fault '{}': kind must be write, read, shortread, flip, sync or index",
                            spec);
  }
  const bool wants_errno = kind->second.second;
  if (parts.size() != (wants_errno ? 3u : 2u)) {
    return invalid_argument("fault '{}': expected {}", spec,
                            wants_errno ? "KIND:N[+|-M]:ERRNO" : "KIND:N[+|-M]");
  }
  SlabIoFault fault;
  fault.kind = kind->second.first;
  std::string count = parts[1];
  std::string last_count;
  bool and_later = false;
  if (!count.empty() && count.back() == '+') {
    and_later = true;
    count.pop_back();
  } else if (const size_t dash = count.find('-'); dash != std::string::npos) {
    last_count = count.substr(dash + 1);
    count.resize(dash);
  }
  auto positive = [](const std::string& text) -> uint64_t {
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
    return text.empty() || *end != '\0' || text[0] == '-' ? 0 : value;
  };
  fault.nth = positive(count);
  if (fault.nth == 0) return invalid_argument("fault '{}': N must be a positive count", spec);
  fault.last = and_later ? UINT64_MAX : fault.nth;
  if (!last_count.empty() || count.size() + 1 == parts[1].size()) {
    if (!and_later) fault.last = positive(last_count);
    if (fault.last < fault.nth) {
      return invalid_argument("fault '{}': N-M needs a count M at or above N", spec);
    }
  }
  if (wants_errno) {
    auto error = parse_errno(parts[2], spec);
    if (!error.is_ok()) return error.status();
    fault.error = *error;
  }
  return fault;
}

const SlabIoFault* FaultInjectingSlabIo::match(std::initializer_list<SlabIoFault::Kind> kinds,
                                               uint64_t count) const {
  for (const SlabIoFault& fault : faults_) {
    if (std::find(kinds.begin(), kinds.end(), fault.kind) == kinds.end()) continue;
    if (fault.applies_to(count)) return &fault;
  }
  return nullptr;
}

void FaultInjectingSlabIo::run(SlabIoChannel channel, std::span<const SlabIoOp> ops,
                               std::span<SlabIoResult> results) {
  using Kind = SlabIoFault::Kind;
  std::vector<SlabIoOp> forwarded;
  std::vector<size_t> forwarded_index;
  std::vector<const SlabIoFault*> applied(ops.size(), nullptr);
  for (size_t i = 0; i < ops.size(); ++i) {
    const SlabIoOp& op = ops[i];
    const bool is_read = op.kind == SlabIoKind::kRead;
    const uint64_t count = is_read ? ++reads_ : ++writes_;
    const SlabIoFault* fault = is_read ? match({Kind::kRead, Kind::kShortRead, Kind::kFlip}, count)
                                       : match({Kind::kWrite}, count);
    applied[i] = fault;
    const std::string where = fmt::format("{} of {} bytes at offset {} (injected fault)",
                                          is_read ? "read" : "write", op.bytes, op.file_offset);
    if (fault != nullptr && (fault->kind == Kind::kWrite || fault->kind == Kind::kRead)) {
      results[i] = SlabIoResult{errno_status(fault->error, where)};
      continue;
    }
    SlabIoOp copy = op;
    // Half the bytes, kept 4 KiB-aligned so an O_DIRECT read stays valid.
    if (fault != nullptr && fault->kind == Kind::kShortRead) copy.bytes = (op.bytes / 2) & ~4095ull;
    forwarded.push_back(copy);
    forwarded_index.push_back(i);
  }
  std::vector<SlabIoResult> inner_results(forwarded.size());
  if (!forwarded.empty()) inner_->run(channel, forwarded, inner_results);
  for (size_t j = 0; j < forwarded.size(); ++j) {
    const size_t i = forwarded_index[j];
    results[i] = std::move(inner_results[j]);
    const SlabIoFault* fault = applied[i];
    if (fault == nullptr || !results[i].status.is_ok()) continue;
    if (fault->kind == Kind::kShortRead) {
      results[i].short_transfer = true;
      results[i].status =
          data_loss("short read: {} of {} bytes moved at offset {} (injected fault)",
                    forwarded[j].bytes, ops[i].bytes, ops[i].file_offset);
    } else if (fault->kind == Kind::kFlip && ops[i].bytes > 0) {
      ops[i].buffer[ops[i].bytes / 3] ^= std::byte{0x20};
    }
  }
}

Status FaultInjectingSlabIo::sync() {
  const uint64_t count = ++syncs_;
  if (const SlabIoFault* fault = match({SlabIoFault::Kind::kSync}, count)) {
    return errno_status(fault->error, "fdatasync slab file (injected fault)");
  }
  return inner_->sync();
}

}  // namespace kvtier
