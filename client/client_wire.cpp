#include "client/client_wire.h"

namespace kvtier {

Status unexpected_reply(wire::Response::Reader response, std::string_view wanted) {
  return internal_error("kvtierd answered {} with reply kind {}", wanted,
                        static_cast<int>(response.which()));
}

void fill_layout(wire::Layout::Builder out, const LayoutSpec& layout) {
  out.setModelId(layout.model_id);
  out.setNumLayers(layout.num_layers);
  out.setNumKvHeads(layout.num_kv_heads);
  out.setHeadDim(layout.head_dim);
  out.setDtype(layout.dtype);
  out.setTokensPerBlock(layout.tokens_per_block);
  out.setTpRank(layout.tp_rank);
  out.setTpSize(layout.tp_size);
  out.setNumBlocks(layout.num_blocks);
  out.setExtraKey(layout.extra_key);
  auto planes = out.initPlanes(static_cast<unsigned>(layout.planes.size()));
  for (size_t i = 0; i < layout.planes.size(); ++i) {
    planes[i].setRegionId(layout.planes[i].region_id);
    planes[i].setOffsetBytes(layout.planes[i].offset_bytes);
    planes[i].setStrideBytes(layout.planes[i].stride_bytes);
    planes[i].setBytesPerBlock(layout.planes[i].bytes_per_block);
  }
}

void fill_hello(wire::Request::Builder request, const LayoutSpec& layout,
                const std::string& engine_name, double prefill_tokens_per_second,
                DeviceKind device_kind, DataPath data_path) {
  auto hello = request.initHello();
  hello.setProtocolVersion(wire::PROTOCOL_VERSION);
  hello.setEngineName(engine_name);
  hello.setDeviceKind(device_kind == DeviceKind::kCuda ? wire::DeviceKind::CUDA
                                                       : wire::DeviceKind::HOST);
  hello.setPrefillTokensPerSecond(prefill_tokens_per_second);
  switch (data_path) {
    case DataPath::kPlaneCopies:
      hello.setDataPath(wire::DataPath::PLANE_COPIES);
      break;
    case DataPath::kStagingKernels:
      hello.setDataPath(wire::DataPath::STAGING_KERNELS);
      break;
    case DataPath::kStagingHost:
      hello.setDataPath(wire::DataPath::STAGING_HOST);
      break;
  }
  fill_layout(hello.initLayout(), layout);
}

Result<HelloInfo> decode_hello(wire::Response::Reader response) {
  if (!response.isHello()) return unexpected_reply(response, "Hello");
  auto reply = response.getHello();
  HelloInfo info;
  info.protocol_version = reply.getProtocolVersion();
  info.layout_digest = reply.getLayoutDigest();
  info.block_bytes = reply.getBlockBytes();
  info.namespace_name = reply.getNamespaceName().cStr();
  info.max_blocks_per_request = reply.getMaxBlocksPerRequest();
  info.device_kind =
      reply.getDeviceKind() == wire::DeviceKind::CUDA ? DeviceKind::kCuda : DeviceKind::kHost;
  for (auto uuid : reply.getGpuUuids()) info.gpu_uuids.emplace_back(uuid.cStr());
  info.device_name = reply.getDeviceName().cStr();
  info.retention_priorities = reply.getRetentionPriorities();
  info.load_plane_ranges = reply.getLoadPlaneRanges();
  info.staging = reply.getStaging();
  return info;
}

}  // namespace kvtier
