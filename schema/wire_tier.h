// The wire's tier numbering (schema/kvtier.capnp `Tier`: hbm, ram, nvme, none, remote)
// against kvtier::Tier (top to bottom, then kNone). Every reply or request that carries
// a tier converts here, so the two numberings never meet by a cast.
#pragma once

#include "common/block_key.h"
#include "schema/kvtier.capnp.h"

namespace kvtier {

inline wire::Tier to_wire(Tier tier) {
  switch (tier) {
    case Tier::kHbm:
      return wire::Tier::HBM;
    case Tier::kRam:
      return wire::Tier::RAM;
    case Tier::kNvme:
      return wire::Tier::NVME;
    case Tier::kRemote:
      return wire::Tier::REMOTE;
    case Tier::kNone:
      break;
  }
  return wire::Tier::NONE;
}

// A value this build does not know (a newer peer's tier) reads as kNone: not held here.
inline Tier from_wire(wire::Tier tier) {
  switch (tier) {
    case wire::Tier::HBM:
      return Tier::kHbm;
    case wire::Tier::RAM:
      return Tier::kRam;
    case wire::Tier::NVME:
      return Tier::kNvme;
    case wire::Tier::REMOTE:
      return Tier::kRemote;
    case wire::Tier::NONE:
      break;
  }
  return Tier::kNone;
}

}  // namespace kvtier
