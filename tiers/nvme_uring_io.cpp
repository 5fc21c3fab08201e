// SlabIo over liburing. Each channel owns one ring, used by one thread at a time, so
// no lock is needed around submission; the file descriptors are shared.
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>

#include "common/log.h"
#include "common/unique_fd.h"
#include "tiers/nvme_io.h"

namespace kvtier {
namespace {

constexpr uint64_t kMaxOpBytes = 1ull << 30;          // io_uring lengths are 32-bit
constexpr uint64_t kMaxRegisteredBytes = 1ull << 30;  // per registered buffer

struct DirectIoAlignment {
  uint32_t memory = 0;  // 0: O_DIRECT not usable on this file
  uint32_t offset = 0;
};

// Asks the file system what O_DIRECT needs (STATX_DIOALIGN, Linux 6.1) rather than
// guessing. glibc's struct statx predates the fields, so the raw kernel struct is
// read at its fixed ABI offsets: stx_mask at 0, dio_mem_align at 152, dio_offset_align
// at 156. Without the answer, 4096 is safe on every block device.
DirectIoAlignment query_direct_io_alignment(int fd) {
  constexpr uint32_t kStatxDioAlign = 0x2000;
  alignas(8) unsigned char buffer[256] = {};
  if (::syscall(SYS_statx, fd, "", AT_EMPTY_PATH, kStatxDioAlign, buffer) == 0) {
    uint32_t mask, memory, offset;
    std::memcpy(&mask, buffer, 4);
    std::memcpy(&memory, buffer + 152, 4);
    std::memcpy(&offset, buffer + 156, 4);
    if (mask & kStatxDioAlign) return {memory, offset};
  }
  return {4096, 4096};
}

bool aligned(uint64_t value, uint32_t alignment) {
  return value % alignment == 0;
}

class UringSlabIo final : public SlabIo {
 public:
  ~UringSlabIo() override {
    for (Channel& channel : channels_) {
      if (channel.initialized) io_uring_queue_exit(&channel.ring);
    }
  }

  static Result<std::unique_ptr<SlabIo>> open(const SlabFileOptions& options);

  void run(SlabIoChannel channel, std::span<const SlabIoOp> ops,
           std::span<SlabIoResult> results) override;
  Status sync() override {
    if (::fdatasync(buffered_fd_.get()) != 0) return errno_status(errno, "fdatasync slab file");
    return Status::ok();
  }
  std::string describe() const override;
  void register_buffers(std::vector<std::span<std::byte>> buffers) override;

 private:
  struct Channel {
    io_uring ring{};
    bool initialized = false;
    bool fixed_buffers = false;
  };

  // Fills `sqe` for the unfinished part of `op`.
  void prepare(Channel& channel, io_uring_sqe* sqe, const SlabIoOp& op, uint64_t done,
               size_t index);
  int registered_index(const std::byte* buffer, uint64_t bytes) const;
  bool use_direct(const std::byte* buffer, uint64_t offset, uint64_t bytes) const;

  // Constant after open (direct_usable_ may only go from true to false; registered_
  // and fixed_buffers are set by register_buffers, before any run()).
  std::string path_;
  UniqueFd direct_fd_;  // -1 when the file system refused O_DIRECT
  UniqueFd buffered_fd_;
  DirectIoAlignment alignment_;
  std::atomic<bool> direct_usable_{false};
  unsigned queue_depth_ = 32;
  std::vector<std::span<std::byte>> registered_;  // index = fixed buffer index
  std::array<Channel, kSlabIoChannels> channels_;
};

Result<std::unique_ptr<SlabIo>> UringSlabIo::open(const SlabFileOptions& options) {
  std::unique_ptr<UringSlabIo> io(new UringSlabIo());
  io->path_ = options.path;
  io->queue_depth_ = std::clamp(options.queue_depth, 1u, 4096u);
  io->buffered_fd_.reset(::open(options.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!io->buffered_fd_.valid()) return errno_status(errno, "open " + options.path);

  struct stat st {};
  if (::fstat(io->buffered_fd_.get(), &st) != 0) return errno_status(errno, "stat " + options.path);
  if (static_cast<uint64_t>(st.st_size) < options.size_bytes) {
    // Preallocated so that a payload write never meets a full disk half way; a file
    // system without fallocate gets a sparse file instead.
    int rc = ::fallocate(io->buffered_fd_.get(), 0, 0, static_cast<off_t>(options.size_bytes));
    if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
      KVTIER_LOG_WARN("{}: fallocate is not supported here; the slab file is sparse", options.path);
      rc = ::ftruncate(io->buffered_fd_.get(), static_cast<off_t>(options.size_bytes));
    }
    if (rc != 0) {
      return errno_status(errno, fmt::format("preallocate {} bytes for {} (--nvme-bytes)",
                                             options.size_bytes, options.path));
    }
  }

  if (options.allow_direct_io) {
    io->direct_fd_.reset(::open(options.path.c_str(), O_RDWR | O_CLOEXEC | O_DIRECT));
    if (io->direct_fd_.valid()) {
      io->alignment_ = query_direct_io_alignment(io->direct_fd_.get());
    }
    if (!io->direct_fd_.valid() || io->alignment_.memory == 0 || io->alignment_.offset == 0) {
      KVTIER_LOG_WARN("{}: the file system refuses O_DIRECT ({}); using buffered I/O", options.path,
                      io->direct_fd_.valid() ? "no alignment" : std::strerror(errno));
      io->direct_fd_.reset();
    } else {
      io->direct_usable_ = true;
    }
  }

  for (Channel& channel : io->channels_) {
    int rc = io_uring_queue_init(io->queue_depth_, &channel.ring, 0);
    if (rc < 0) return errno_status(-rc, "io_uring_queue_init");
    channel.initialized = true;
  }
  if (!options.buffers.empty()) io->register_buffers(options.buffers);
  KVTIER_LOG_INFO("NVMe slab file {}: {}", options.path, io->describe());
  return std::unique_ptr<SlabIo>(std::move(io));
}

void UringSlabIo::register_buffers(std::vector<std::span<std::byte>> buffers) {
  // Registration pins the pages (faulting in any that are not yet there), which is why
  // the daemon registers its pools only after filling them.
  std::vector<iovec> iovecs;
  std::vector<std::span<std::byte>> registered;
  for (std::span<std::byte> buffer : buffers) {
    for (uint64_t at = 0; at < buffer.size(); at += kMaxRegisteredBytes) {
      const uint64_t bytes = std::min<uint64_t>(kMaxRegisteredBytes, buffer.size() - at);
      iovecs.push_back({buffer.data() + at, bytes});
      registered.push_back(buffer.subspan(at, bytes));
    }
  }
  if (iovecs.empty()) return;
  for (Channel& channel : channels_) {
    if (!channel.initialized || channel.fixed_buffers) continue;
    const int rc = io_uring_register_buffers(&channel.ring, iovecs.data(),
                                             static_cast<unsigned>(iovecs.size()));
    if (rc < 0) {
      KVTIER_LOG_WARN(
          "{}: io_uring cannot register the tier memory as fixed buffers ({}); "
          "using unregistered I/O",
          path_, std::strerror(-rc));
    } else {
      channel.fixed_buffers = true;
    }
  }
  registered_ = std::move(registered);
}

std::string UringSlabIo::describe() const {
  std::string mode = direct_usable_ ? fmt::format("O_DIRECT (alignment: memory {}, offset {})",
                                                  alignment_.memory, alignment_.offset)
                                    : std::string("buffered");
  return fmt::format("io_uring, {}, queue depth {}, {}", mode, queue_depth_,
                     channels_[0].fixed_buffers ? "registered buffers" : "unregistered buffers");
}

int UringSlabIo::registered_index(const std::byte* buffer, uint64_t bytes) const {
  for (size_t i = 0; i < registered_.size(); ++i) {
    const std::byte* begin = registered_[i].data();
    if (buffer >= begin && buffer + bytes <= begin + registered_[i].size()) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

bool UringSlabIo::use_direct(const std::byte* buffer, uint64_t offset, uint64_t bytes) const {
  return direct_usable_.load(std::memory_order_relaxed) &&
         aligned(reinterpret_cast<uintptr_t>(buffer), alignment_.memory) &&
         aligned(offset, alignment_.offset) && aligned(bytes, alignment_.offset);
}

void UringSlabIo::prepare(Channel& channel, io_uring_sqe* sqe, const SlabIoOp& op, uint64_t done,
                          size_t index) {
  std::byte* buffer = op.buffer + done;
  const uint64_t offset = op.file_offset + done;
  const unsigned bytes = static_cast<unsigned>(std::min(op.bytes - done, kMaxOpBytes));
  const int fd = use_direct(buffer, offset, bytes) ? direct_fd_.get() : buffered_fd_.get();
  const int fixed = channel.fixed_buffers ? registered_index(buffer, bytes) : -1;
  if (op.kind == SlabIoKind::kRead) {
    if (fixed >= 0) {
      io_uring_prep_read_fixed(sqe, fd, buffer, bytes, offset, fixed);
    } else {
      io_uring_prep_read(sqe, fd, buffer, bytes, offset);
    }
  } else if (fixed >= 0) {
    io_uring_prep_write_fixed(sqe, fd, buffer, bytes, offset, fixed);
  } else {
    io_uring_prep_write(sqe, fd, buffer, bytes, offset);
  }
  // The high bit says the op went to the O_DIRECT descriptor (see EINVAL below).
  io_uring_sqe_set_data64(sqe, index | (fd == direct_fd_.get() ? 1ull << 63 : 0));
}

void UringSlabIo::run(SlabIoChannel which, std::span<const SlabIoOp> ops,
                      std::span<SlabIoResult> results) {
  Channel& channel = channels_[static_cast<size_t>(which)];
  std::vector<uint64_t> done(ops.size(), 0);
  std::deque<size_t> queued;
  for (size_t i = 0; i < ops.size(); ++i) {
    results[i] = SlabIoResult{};
    if (ops[i].bytes > 0) queued.push_back(i);
  }
  auto what = [&](size_t i) {
    return fmt::format("{} of {} bytes at offset {} of {}",
                       ops[i].kind == SlabIoKind::kRead ? "read" : "write", ops[i].bytes,
                       ops[i].file_offset, path_);
  };
  unsigned in_flight = 0;
  while (!queued.empty() || in_flight > 0) {
    // Fill the ring up to the queue depth, then submit once: one syscall per batch.
    unsigned prepared = 0;
    while (!queued.empty() && in_flight < queue_depth_) {
      io_uring_sqe* sqe = io_uring_get_sqe(&channel.ring);
      if (sqe == nullptr) break;
      const size_t i = queued.front();
      queued.pop_front();
      prepare(channel, sqe, ops[i], done[i], i);
      ++in_flight;
      ++prepared;
    }
    if (prepared > 0) {
      int rc;
      while ((rc = io_uring_submit(&channel.ring)) < 0) {
        if (rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ENOMEM) {
          // Only a kernel or daemon bug gets here (a bad ring or fd). Returning would
          // let an accepted read land later in memory that was reused meanwhile, so
          // stop the process instead of risking a wrong byte.
          KVTIER_LOG_ERROR("io_uring_submit on {}: {}; aborting", path_, std::strerror(-rc));
          std::abort();
        }
        ::usleep(1000);  // transient kernel memory or queue pressure
      }
    }
    io_uring_cqe* cqe = nullptr;
    int rc = io_uring_wait_cqe(&channel.ring, &cqe);
    if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
    if (rc < 0) {
      KVTIER_LOG_ERROR("io_uring_wait_cqe on {}: {}; aborting", path_, std::strerror(-rc));
      std::abort();  // as for io_uring_submit above
    }
    while (rc == 0 && cqe != nullptr) {
      const uint64_t data = io_uring_cqe_get_data64(cqe);
      const size_t i = static_cast<size_t>(data & ~(1ull << 63));
      const bool was_direct = (data >> 63) != 0;
      const int res = cqe->res;
      io_uring_cqe_seen(&channel.ring, cqe);
      --in_flight;
      if (res == -EAGAIN || res == -EINTR) {
        queued.push_back(i);
      } else if (res == -EINVAL && was_direct) {
        // Some file systems accept O_DIRECT at open and refuse it per I/O.
        if (direct_usable_.exchange(false)) {
          KVTIER_LOG_WARN("{}: O_DIRECT I/O refused (EINVAL); using buffered I/O", path_);
        }
        queued.push_back(i);
      } else if (res < 0) {
        results[i].status = errno_status(-res, what(i));
      } else if (res == 0) {
        results[i].short_transfer = true;
        results[i].status =
            data_loss("short {}: {} of {} bytes moved at offset {} of {} (end of file)",
                      ops[i].kind == SlabIoKind::kRead ? "read" : "write", done[i], ops[i].bytes,
                      ops[i].file_offset, path_);
      } else {
        done[i] += static_cast<uint64_t>(res);
        if (done[i] < ops[i].bytes) queued.push_back(i);  // short transfer: do the rest
      }
      rc = io_uring_peek_cqe(&channel.ring, &cqe);
    }
  }
}

}  // namespace

Result<std::unique_ptr<SlabIo>> open_uring_slab_io(const SlabFileOptions& options) {
  return UringSlabIo::open(options);
}

}  // namespace kvtier
