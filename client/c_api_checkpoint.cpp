// kvtier_checkpoint_digest (kvtier.h): the checkpoint digest of the model fingerprint's
// key scheme, byte for byte what client/python/kvtier/fingerprint.py's
// checkpoint_digest computes, for engines that are not in Python. Boost.JSON reads the
// safetensors headers (Boost is already a dependency; its header-only build lives in
// this library alone, whose symbols stay hidden); OpenSSL's libcrypto hashes.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <boost/json/src.hpp>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/c_api_internal.h"
#include "client/kvtier.h"
#include "common/unique_fd.h"

#define KVTIER_EXPORT extern "C" __attribute__((visibility("default")))

using namespace kvtier;
using namespace kvtier::c_api;

namespace {

constexpr std::string_view kScheme = "kvtier-model-v1";
constexpr std::array<std::string_view, 9> kWeightSuffixes = {
    ".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".npz", ".h5", ".msgpack"};
constexpr std::array<std::string_view, 7> kConfigNames = {
    "config.json",         "params.json",          "quantize_config.json",
    "quant_config.json",   "hf_quant_config.json", "quantization_config.json",
    "kv_cache_scales.json"};
constexpr std::string_view kConfigSuffix = ".index.json";
constexpr uint64_t kTensorSampleBytes = 64;
constexpr uint64_t kFileSamples = 16;
constexpr uint64_t kFileSampleBytes = 4096;
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr uint64_t kMaxConfigBytes = 64ull << 20;

struct MdCtxFree {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1) ok_ = false;
  }
  void update(const void* data, size_t size) {
    if (ok_ && size > 0 && EVP_DigestUpdate(ctx_.get(), data, size) != 1) ok_ = false;
  }
  void update(std::string_view text) { update(text.data(), text.size()); }
  void u64(uint64_t value) {
    uint8_t le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<uint8_t>(value >> (8 * i));
    update(le, sizeof le);
  }
  void field(std::string_view data) {  // length-prefixed, as fingerprint.py's _field
    u64(data.size());
    update(data);
  }
  Result<std::string> hex() {
    unsigned char out[32];
    unsigned int length = 0;
    if (!ok_ || EVP_DigestFinal_ex(ctx_.get(), out, &length) != 1 || length != 32) {
      return internal_error("SHA-256 failed in libcrypto");
    }
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string text(64, '0');
    for (int i = 0; i < 32; ++i) {
      text[2 * i] = kDigits[out[i] >> 4];
      text[2 * i + 1] = kDigits[out[i] & 15];
    }
    return text;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx_;
  bool ok_ = true;
};

// Up to `count` bytes at `offset` (fewer at the end of the file), as os.pread.
Result<std::string> read_at(int fd, uint64_t offset, uint64_t count) {
  std::string out(count, '\0');
  uint64_t done = 0;
  while (done < count) {
    const ssize_t n =
        ::pread(fd, out.data() + done, count - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return unavailable("reading a weight file: {}", std::strerror(errno));
    }
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
  }
  out.resize(done);
  return out;
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

Status sample_file(int fd, uint64_t size, Sha256& h) {
  if (size <= kFileSamples * kFileSampleBytes) {
    auto all = read_at(fd, 0, size);
    if (!all.is_ok()) return all.status();
    h.update(*all);
    return Status::ok();
  }
  const double step = static_cast<double>(size - kFileSampleBytes) / (kFileSamples - 1);
  for (uint64_t i = 0; i < kFileSamples; ++i) {
    auto sample =
        read_at(fd, static_cast<uint64_t>(static_cast<double>(i) * step), kFileSampleBytes);
    if (!sample.is_ok()) return sample.status();
    h.update(*sample);
  }
  return Status::ok();
}

// A JSON integer as fingerprint.py's isinstance(o, int) sees it (never a bool or float).
std::optional<long double> integer(const boost::json::value& v) {
  if (v.is_int64()) return static_cast<long double>(v.as_int64());
  if (v.is_uint64()) return static_cast<long double>(v.as_uint64());
  return std::nullopt;
}

// Hashes the header and samples of every tensor; nullopt when the file is not
// safetensors as its name says (it is then sampled as an opaque file).
Result<std::optional<uint64_t>> sample_safetensors(int fd, uint64_t size, Sha256& h) {
  if (size < 8) return std::optional<uint64_t>();
  auto prefix = read_at(fd, 0, 8);
  if (!prefix.is_ok()) return prefix.status();
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>((*prefix)[i]);
  if (length > kMaxHeaderBytes || 8 + length > size) return std::optional<uint64_t>();
  auto raw = read_at(fd, 8, length);
  if (!raw.is_ok()) return raw.status();
  boost::system::error_code ec;
  boost::json::value header = boost::json::parse(*raw, ec);
  if (ec || !header.is_object()) return std::optional<uint64_t>();
  h.field(*raw);
  const auto& object = header.as_object();
  std::vector<std::string_view> names;
  for (const auto& member : object) {
    if (member.key() != "__metadata__") names.push_back(member.key());
  }
  std::sort(names.begin(), names.end());
  const long double data_start = static_cast<long double>(8 + length);
  uint64_t sampled = 0;
  for (std::string_view name : names) {
    const boost::json::value& entry = object.at(name);
    if (!entry.is_object()) continue;
    const boost::json::value* offsets = entry.as_object().if_contains("data_offsets");
    if (offsets == nullptr || !offsets->is_array() || offsets->as_array().size() != 2) continue;
    const auto first = integer(offsets->as_array()[0]);
    const auto last = integer(offsets->as_array()[1]);
    if (!first || !last) continue;
    const long double begin = data_start + *first, end = data_start + *last;
    if (!(data_start <= begin && begin <= end && end <= static_cast<long double>(size))) continue;
    const auto b = static_cast<uint64_t>(begin), e = static_cast<uint64_t>(end);
    const uint64_t span = e - b;
    const uint64_t n = std::min(kTensorSampleBytes, span);
    for (uint64_t at : {b, b + (span - n) / 2, e - n}) {
      auto sample = read_at(fd, at, n);
      if (!sample.is_ok()) return sample.status();
      h.update(*sample);
    }
    ++sampled;
  }
  return std::optional<uint64_t>(sampled);
}

std::string lowered(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

Result<std::string> checkpoint_digest(const char* folder, uint64_t* tensors_out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) return not_found("{} is not a directory", folder);
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(folder, ec)) {
    names.push_back(entry.path().filename().string());
  }
  if (ec) return unavailable("listing {}: {}", folder, ec.message());
  std::sort(names.begin(), names.end());
  Sha256 h;
  h.update(kScheme);
  uint64_t tensors = 0;
  for (const std::string& name : names) {
    const std::string path = (fs::path(folder) / name).string();
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;  // links followed
    const std::string lower = lowered(name);
    const auto size = static_cast<uint64_t>(st.st_size);
    const bool weights = std::any_of(kWeightSuffixes.begin(), kWeightSuffixes.end(),
                                     [&](std::string_view s) { return ends_with(lower, s); });
    const bool config =
        std::find(kConfigNames.begin(), kConfigNames.end(), lower) != kConfigNames.end() ||
        ends_with(lower, kConfigSuffix);
    if (!weights && !config) continue;
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return unavailable("opening {}: {}", path, std::strerror(errno));
    if (weights) {
      h.update("W");
      h.field(name);
      h.u64(size);
      std::optional<uint64_t> sampled;
      if (ends_with(lower, ".safetensors")) {
        auto result = sample_safetensors(fd.get(), size, h);
        if (!result.is_ok()) return result.status();
        sampled = *result;
      }
      if (sampled) {
        tensors += *sampled;
      } else {
        KVTIER_RETURN_IF_ERROR(sample_file(fd.get(), size, h));
      }
    } else {
      auto content = read_at(fd.get(), 0, std::min(size, kMaxConfigBytes));
      if (!content.is_ok()) return content.status();
      h.update("C");
      h.field(name);
      h.u64(size);
      h.field(*content);
    }
  }
  if (tensors_out != nullptr) *tensors_out = tensors;
  return h.hex();
}

}  // namespace

KVTIER_EXPORT kvtier_status kvtier_checkpoint_digest(const char* folder, char* digest_hex,
                                                     size_t digest_bytes,
                                                     uint64_t* tensors_sampled) {
  return guarded([&]() -> Status {
    KVTIER_RETURN_IF_ERROR(require(folder, "folder"));
    KVTIER_RETURN_IF_ERROR(require(digest_hex, "digest_hex"));
    if (digest_bytes < 65) {
      return invalid_argument("digest_hex holds {} bytes; 65 are needed", digest_bytes);
    }
    auto digest = checkpoint_digest(folder, tensors_sampled);
    if (!digest.is_ok()) return digest.status();
    std::memcpy(digest_hex, digest->c_str(), 65);
    return Status::ok();
  });
}
