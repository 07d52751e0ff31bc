// ascendc_emu: SoC profiles, the per-block emulation state and rule enforcement.
//
// Every AscendC call of a kernel runs against the BlockContext of the block being emulated. The
// launcher (ap_emu_launch.h) creates one per block and publishes it through a thread_local
// pointer for the lifetime of that block only: AscendC's free functions (GetBlockIdx(), DataCopy,
// Add, ...) take no context argument, so the emulation has to find it implicitly. Nothing else is
// global; two launches never share state.
//
// A broken rule throws RuleViolation with a message naming the rule, the API, the block and the
// offending values; the launcher turns it into a non-zero status and the message.
#ifndef ASCENDC_EMU_CONTEXT_H
#define ASCENDC_EMU_CONTEXT_H

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "enums.h"
#include "numeric.h"

namespace ascendc_emu {

// --------------------------------------------------------------------------------- SoC profiles
// ub_bytes: Unified Buffer per vector core, 192 KiB on NPU architecture 2201 (Atlas A2/A3), per
// the AscendC programming guide's "NPU architecture 2201" storage table. vector/cube cores: the
// SoCInfo section (vector_core_cnt, cube_core_cnt) of CANN's platform_config/<soc>.ini. See
// docs/ASCENDC_EMU.md for the sources.
struct SocProfile {
  const char* name;
  uint32_t vector_cores;
  uint32_t cube_cores;
  uint32_t ub_bytes;
  uint32_t que_buffers_per_position;  // eventIDs per TPosition (TQue buffer limit)
};

// Atlas A2 (910B*) and A3 (910_93*) share NPU architecture 2201; a device reports its own core
// counts (the npu backend reads them from torch_npu), these are the emulation's defaults.
inline constexpr SocProfile kSocProfiles[] = {
    {"Ascend910B1", 48, 24, 192 * 1024, 8},    {"Ascend910B2", 48, 24, 192 * 1024, 8},
    {"Ascend910B2C", 48, 24, 192 * 1024, 8},   {"Ascend910B3", 40, 20, 192 * 1024, 8},
    {"Ascend910B4", 40, 20, 192 * 1024, 8},    {"Ascend910B4_1", 40, 20, 192 * 1024, 8},
    {"Ascend910_9391", 48, 24, 192 * 1024, 8}, {"Ascend910_9392", 48, 24, 192 * 1024, 8},
    {"Ascend910_9381", 48, 24, 192 * 1024, 8}, {"Ascend910_9382", 48, 24, 192 * 1024, 8},
    {"Ascend910_9372", 40, 20, 192 * 1024, 8}, {"Ascend910_9362", 40, 20, 192 * 1024, 8},
    {"Ascend910_9363", 40, 20, 192 * 1024, 8},
};
inline constexpr const char* kDefaultSoc = "Ascend910B2";
// UB the framework keeps back from kernels: 256 B always, plus 8 KiB for the APIs that need a
// scratch area (Select modes 1/2, ...) unless built with --cce-disable-asc-reserved-ubuf.
inline constexpr uint32_t kUbFrameworkReserve = 256;
inline constexpr uint32_t kUbAscReserve = 8 * 1024;
inline constexpr uint32_t kMaxBuffersPerKernel = 64;  // TPipe::InitBuffer constraint
inline constexpr uint32_t kMaxBlockDim = 65535;
inline constexpr uint32_t kEventIdsPerHardEvent = 8;
inline constexpr uint32_t kBlockBytes = 32;   // one DataBlock
inline constexpr uint32_t kRepeatBytes = 256;  // one Vector repeat

inline const SocProfile* find_soc(const std::string& name) {
  for (const auto& s : kSocProfiles) {
    if (name == s.name) return &s;
  }
  return nullptr;
}

inline std::string soc_names() {
  std::string out;
  for (const auto& s : kSocProfiles) out += (out.empty() ? "" : ", ") + std::string(s.name);
  return out;
}

// --------------------------------------------------------------------------------- messages
class RuleViolation : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown into blocks parked in SyncAll when another block failed, to unwind them.
struct BlockCancelled {};

template <class... A>
std::string str(const A&... a) {
  std::ostringstream o;
  (o << ... << a);
  return o.str();
}

// ------------------------------------------------------------------------------- launch state
struct GmRegion {
  const uint8_t* base;
  uint64_t bytes;  // 0: size unknown (ICPU_RUN_KF without sizes): not bounds-checked
  uint32_t arg;
};

class SyncPoint {
 public:
  virtual ~SyncPoint() = default;
  virtual void sync_all(uint32_t block) = 0;
};

struct Launch {
  const SocProfile* soc;
  uint32_t block_dim;
  uint32_t ub_usable;
  bool asc_reserve;  // the 8 KiB ASC scratch area is reserved (no --cce-disable-asc-reserved-ubuf)
  std::vector<GmRegion> gm;
  SyncPoint* sync;
};

enum class SlotState : uint8_t { FREE, ALLOCATED, ENQUEUED, DEQUEUED };

inline const char* slot_state_name(SlotState s) {
  switch (s) {
    case SlotState::FREE: return "free";
    case SlotState::ALLOCATED: return "allocated";
    case SlotState::ENQUEUED: return "enqueued";
    case SlotState::DEQUEUED: return "dequeued";
  }
  return "?";
}

struct QueueState;

// One InitBuffer'd memory block of a TQue.
struct BufferSlot {
  uint8_t* addr;
  uint32_t bytes;
  SlotState state;
  uint32_t generation;  // bumped by FreeTensor: stale LocalTensor handles are detected
  QueueState* owner;
  uint32_t index;
  uint64_t enque_insn = 0;  // the last instruction before its EnQue (what DeQue synchronises)
};

struct QueueState {
  uint32_t id;
  AscendC::TPosition pos;
  int32_t depth;
  uint32_t len;
  bool retired;  // its TPipe was Reset or destroyed: the TQue must be InitBuffer'd again
  std::vector<BufferSlot> slots;
  std::deque<BufferSlot*> fifo;
  std::string name() const {
    return str("TQue #", id, " (", position_name(pos), ", depth ", depth, ", ", slots.size(),
               " x ", len, " B)");
  }
};

enum class AtomicMode : uint8_t { NONE, ADD, MAX, MIN };

// ------------------------------------------------------------------------------ pipelines
// The hardware pipelines an instruction runs on (AscendC programming guide, "core synchronisation"):
// S the scalar unit, V the Vector unit, MTE2 GM->UB copies, MTE3 UB->GM copies. Instructions of
// different pipes, and on arch 2201 dependent instructions of the V pipe, are ordered only by
// explicit synchronisation (EnQue/DeQue, SetFlag/WaitFlag, PipeBarrier) unless the compiler's
// auto-sync (--cce-auto-sync) inserts it. The emulation runs every instruction at once, so it
// tracks the UB ranges each pipe has in flight and aborts where the device would race.
enum class Pipe : uint8_t { S, V, MTE2, MTE3 };

struct PipeRange {
  const uint8_t* lo;
  const uint8_t* hi;
  uint64_t insn;  // the instruction that touched it (its own operands never conflict)
  const char* api;
};

// ------------------------------------------------------------------------------ block state
class BlockContext {
 public:
  BlockContext(const Launch& launch, uint32_t block_idx)
      : launch_(launch), block_idx_(block_idx), storage_(launch.soc->ub_bytes + 64, 0xff) {
    // 0xff: freshly allocated UB holds garbage on the device (AllocTensor's doc); all-ones
    // bytes are NaN in float/half, so a kernel that reads what it never wrote shows it.
    auto p = reinterpret_cast<uintptr_t>(storage_.data());
    ub_ = storage_.data() + ((64 - p % 64) % 64);
  }
  BlockContext(const BlockContext&) = delete;
  BlockContext& operator=(const BlockContext&) = delete;

  const Launch& launch() const { return launch_; }
  uint32_t block_idx() const { return block_idx_; }
  uint8_t* ub() const { return ub_; }
  uint64_t ub_offset(const void* p) const {
    return static_cast<uint64_t>(static_cast<const uint8_t*>(p) - ub_);
  }
  bool in_ub(const void* p) const {
    auto b = static_cast<const uint8_t*>(p);
    return b >= ub_ && b < ub_ + launch_.soc->ub_bytes;
  }
  std::string where() const {
    return str("block ", block_idx_, " of ", launch_.block_dim, ", SoC ", launch_.soc->name);
  }

  // UB bump allocation for the one live TPipe.
  uint32_t ub_used = 0;
  void* pipe = nullptr;  // the live AscendC::TPipe

  // Forgets the live TPipe's buffers (TPipe::Reset/Destroy). Queue states stay (LocalTensor
  // handles point at them): their buffers become stale and the kernel-end check still sees them.
  void release_buffers() {
    for (auto& q : queues) {
      q.retired = true;
      for (auto& s : q.slots) ++s.generation;
    }
    ub_used = 0;
    buffers_used = 0;
    for (auto& n : que_buffers) n = 0;
    ++pipe_epoch;
  }
  uint32_t pipe_epoch = 0;  // TBufs initialised in an earlier epoch are stale
  uint32_t buffers_used = 0;
  uint32_t que_buffers[static_cast<unsigned>(AscendC::TPosition::MAX) + 1] = {};
  std::deque<QueueState> queues;  // deque: stable addresses for TQue and LocalTensor handles
  std::map<std::pair<int, int>, int> flags;  // (HardEvent, eventID) -> pending SetFlag count
  bool pad_value_set = false;
  uint64_t pad_value_bits = 0;
  AtomicMode atomic = AtomicMode::NONE;
  const char* atomic_type = "";

  // Pipe ordering (see Pipe): the current instruction and the ranges in flight.
  uint64_t insn = 0;
  int insn_depth = 0;
  Pipe insn_pipe = Pipe::S;
  std::vector<PipeRange> v_writes, v_reads;  // V instructions since the last PipeBarrier<PIPE_V>
  std::vector<PipeRange> v_unsynced_s;       // V writes the scalar unit may not read yet (V_S)
  std::vector<PipeRange> v_unsynced_mte3;    // V writes MTE3 may not copy out yet (V_MTE3 / VECOUT DeQue)
  std::vector<PipeRange> mte2_pending;       // GM->UB copies V/S may not read yet (MTE2_V / VECIN DeQue)
  const char* insn_api = "";
  int kernel_type = -1;                      // KERNEL_TASK_TYPE_DEFAULT(...), -1: not set
  uint8_t* sys_workspace = nullptr;          // SetSysWorkspace(...)

 private:
  const Launch& launch_;
  uint32_t block_idx_;
  std::vector<uint8_t> storage_;
  uint8_t* ub_;
};

inline thread_local BlockContext* tls_block = nullptr;

inline BlockContext& ctx() {
  if (tls_block == nullptr) {
    throw RuleViolation(
        "ascendc_emu: an AscendC API was called outside a kernel launch; run kernels through "
        "ap_emu_launch() or ICPU_RUN_KF()");
  }
  return *tls_block;
}

inline void forget_range(BlockContext& c, const uint8_t* p, uint64_t bytes) {
  for (auto* rs : {&c.v_writes, &c.v_reads, &c.v_unsynced_s, &c.v_unsynced_mte3, &c.mte2_pending}) {
    rs->erase(std::remove_if(rs->begin(), rs->end(), [&](const PipeRange& r) { return r.lo < p + bytes && p < r.hi; }),
              rs->end());
  }
}

[[noreturn]] inline void violate(const std::string& rule, const std::string& api,
                                 const std::string& detail) {
  const std::string where = tls_block ? tls_block->where() : std::string("no active block");
  throw RuleViolation(str("ascendc_emu: rule '", rule, "' violated by ", api, " (", where,
                          "): ", detail));
}

inline std::string ub_range(const uint8_t* lo, const uint8_t* hi) {
  return str("[UB ", ctx().ub_offset(lo), ", +", hi - lo, " B)");
}

// The instruction being executed (an RAII guard at each API entry; nested API calls belong to the
// outermost one).
class Insn {
 public:
  Insn(Pipe pipe, const char* api) : c_(tls_block) {
    if (c_ != nullptr && c_->insn_depth++ == 0) {
      ++c_->insn;
      c_->insn_pipe = pipe;
      c_->insn_api = api;
    }
  }
  ~Insn() {
    if (c_ != nullptr) --c_->insn_depth;
  }
  Insn(const Insn&) = delete;
  Insn& operator=(const Insn&) = delete;

 private:
  BlockContext* c_;
};

// ------------------------------------------------------------------------------ rule checks
// A LocalTensor as the checks see it.
struct UbView {
  uint8_t* addr;
  uint64_t bytes;     // the tensor's size in bytes (GetSize() * sizeof(T))
  BufferSlot* slot;   // nullptr for TBuf tensors
  uint32_t generation;
};

inline std::string ub_desc(const UbView& v) {
  return str("UB offset ", ctx().ub_offset(v.addr), ", ", v.bytes, " B");
}

// ------------------------------------------------------------------------- pipe ordering
#ifndef ASCENDC_EMU_AUTO_SYNC
#define ASCENDC_EMU_AUTO_SYNC 0  // 1: as built with --cce-auto-sync (the compiler orders the pipes)
#endif
inline constexpr const char* kSyncDoc =
    "AscendC API reference: PipeBarrier(ISASI), SetFlag/WaitFlag, TQue EnQue/DeQue (core synchronisation)";

inline const PipeRange* hit(const std::vector<PipeRange>& rs, const uint8_t* lo, const uint8_t* hi,
                            uint64_t insn) {
  for (const auto& r : rs) {
    if (r.insn != insn && r.lo < hi && lo < r.hi) return &r;
  }
  return nullptr;
}

inline void forget_before(std::vector<PipeRange>& rs, uint64_t insn) {
  rs.erase(std::remove_if(rs.begin(), rs.end(), [&](const PipeRange& r) { return r.insn <= insn; }), rs.end());
}

// Records (and checks) one UB access of the current instruction. `operand` "dst" is written,
// "sharedTmpBuffer" read and written, anything else read; accesses outside an instruction are the
// scalar unit's (LocalTensor::GetValue/SetValue).
inline void track_access(BlockContext& c, const std::string& api, const char* operand, const uint8_t* p,
                         uint64_t bytes) {
  if (ASCENDC_EMU_AUTO_SYNC || bytes == 0) return;
  const uint8_t* lo = p;
  const uint8_t* hi = p + bytes;
  const bool tmp = std::strcmp(operand, "sharedTmpBuffer") == 0;
  const bool write = tmp || std::strcmp(operand, "dst") == 0 || api.find("SetValue") != std::string::npos;
  const bool read = tmp || !write || api.find("operator()") != std::string::npos;
  const Pipe pipe = c.insn_depth ? c.insn_pipe : Pipe::S;
  const uint64_t id = c.insn_depth ? c.insn : ~uint64_t(0);
  const char* name = c.insn_depth ? "" : "scalar";
  if (pipe == Pipe::V || pipe == Pipe::S) {
    if (const auto* r = hit(c.mte2_pending, lo, hi, id)) {
      violate(pipe == Pipe::V ? "a Vector instruction touches UB only after the MTE2 copy into it is synchronised"
                              : "the scalar unit reads UB only after the MTE2 copy into it is synchronised",
              api, str(operand, " ", ub_range(lo, hi), " is still in flight from ", r->api,
                       " (GM->UB, MTE2): DeQue it from its VECIN TQue after EnQue, or "
                       "SetFlag/WaitFlag<HardEvent::", pipe == Pipe::V ? "MTE2_V" : "MTE2_S", "> [", kSyncDoc, "]"));
    }
  }
  if (pipe == Pipe::S && read) {
    if (const auto* r = hit(c.v_unsynced_s, lo, hi, id)) {
      violate("a scalar read of UB the Vector unit wrote waits for SetFlag/WaitFlag<HardEvent::V_S>", api,
              str(operand, " ", ub_range(lo, hi), " was written by ", r->api,
                  " on the V pipe and no WaitFlag<HardEvent::V_S> came between [", kSyncDoc, "]"));
    }
  }
  if (pipe == Pipe::V) {
    const PipeRange* r = read ? hit(c.v_writes, lo, hi, id) : nullptr;
    if (!r && write) r = hit(c.v_writes, lo, hi, id);
    if (r) {
      violate("dependent Vector instructions are ordered by PipeBarrier<PIPE_V>() (auto-sync off)", api,
              str(operand, " ", ub_range(lo, hi), read ? " reads" : " overwrites", " what ", r->api,
                  " wrote on the V pipe with no PipeBarrier<PIPE_V>() between: on arch 2201 dependent vector "
                  "instructions are not ordered by the hardware [", kSyncDoc, "]"));
    }
    if (write) {
      c.v_writes.push_back({lo, hi, id, name[0] ? name : c.insn_api});
      c.v_unsynced_s.push_back({lo, hi, id, c.insn_api});
      c.v_unsynced_mte3.push_back({lo, hi, id, c.insn_api});
    }
    if (read) c.v_reads.push_back({lo, hi, id, c.insn_api});
  } else if (pipe == Pipe::MTE2 && write) {
    c.mte2_pending.push_back({lo, hi, id, c.insn_api});
  } else if (pipe == Pipe::MTE3 && read) {
    if (const auto* r = hit(c.v_unsynced_mte3, lo, hi, id)) {
      violate("a UB->GM copy of data the Vector unit wrote waits for EnQue/DeQue (VECOUT) or "
              "SetFlag/WaitFlag<HardEvent::V_MTE3>", api,
              str(operand, " ", ub_range(lo, hi), " was written by ", r->api, " on the V pipe [", kSyncDoc, "]"));
    }
  }
}

// Checks that an operand may be accessed: allocated and not freed, not sitting in a queue, start
// aligned, and `bytes` within the tensor.
inline void check_ub(const std::string& api, const char* operand, const UbView& v, uint64_t bytes,
                     uint32_t align = kBlockBytes) {
  auto& c = ctx();
  if (v.addr == nullptr) {
    violate("LocalTensor must come from AllocTensor/DeQue/TBuf::Get", api,
            str(operand, " is a default-constructed LocalTensor"));
  }
  if (v.slot != nullptr) {
    if (v.slot->generation != v.generation || v.slot->state == SlotState::FREE) {
      violate("no use after FreeTensor", api,
              str(operand, " belongs to buffer ", v.slot->index, " of ", v.slot->owner->name(),
                  ", which was freed (FreeTensor) after this tensor was obtained"));
    }
    if (v.slot->state == SlotState::ENQUEUED) {
      violate("EnQue/DeQue pairing", api,
              str(operand, " is in ", v.slot->owner->name(),
                  " (EnQue'd, not yet DeQue'd): DeQue it before touching its data"));
    }
  }
  const uint64_t off = c.ub_offset(v.addr);
  if (off % align != 0) {
    violate(str(align, "-byte alignment of UB operands"), api,
            str(operand, " starts at UB offset ", off, ", not a multiple of ", align));
  }
  if (bytes > v.bytes) {
    violate("LocalTensor bounds", api,
            str(operand, " holds ", v.bytes, " B (", ub_desc(v), ") but the call touches ", bytes,
                " B"));
  }
  track_access(c, api, operand, v.addr, bytes);
}

// Operands of one instruction either coincide or do not overlap (general overlap constraint).
inline void check_overlap(const std::string& api, const char* a_name, const uint8_t* a,
                          uint64_t a_bytes, const char* b_name, const uint8_t* b, uint64_t b_bytes) {
  if (a == b || a_bytes == 0 || b_bytes == 0) return;
  if (a < b + b_bytes && b < a + a_bytes) {
    violate("operands overlap completely or not at all", api,
            str(a_name, " [UB ", ctx().ub_offset(a), ", +", a_bytes, " B) partially overlaps ", b_name,
                " [UB ", ctx().ub_offset(b), ", +", b_bytes, " B)"));
  }
}

// A Global Memory range must lie inside one kernel argument buffer (when sizes are known).
inline void check_gm(const std::string& api, const void* p, uint64_t bytes, uint32_t align) {
  const auto& regions = ctx().launch().gm;
  auto addr = static_cast<const uint8_t*>(p);
  if (reinterpret_cast<uintptr_t>(p) % align != 0) {
    violate("GM address aligned to the element size", api,
            str("GM address ", p, " is not a multiple of ", align, " bytes"));
  }
  if (regions.empty() || bytes == 0) return;
  const GmRegion* hit = nullptr;
  for (const auto& r : regions) {
    if (r.base <= addr && (hit == nullptr || r.base > hit->base)) hit = &r;
  }
  if (hit == nullptr) {
    violate("GM access inside a kernel argument", api,
            str("GM range [", p, ", +", bytes, " B) lies below every kernel argument buffer"));
  }
  if (hit->bytes == 0) return;
  const uint64_t off = static_cast<uint64_t>(addr - hit->base);
  if (off + bytes > hit->bytes) {
    violate("GM access inside a kernel argument", api,
            str("bytes [", off, ", ", off + bytes, ") of kernel argument ", hit->arg,
                ", which holds ", hit->bytes, " B"));
  }
}

// Every queue buffer is back to free (at kernel end and on TPipe::Reset).
inline void check_queues_idle(const BlockContext& c, const char* api) {
  for (const auto& q : c.queues) {
    std::string busy;
    for (const auto& s : q.slots) {
      if (s.state != SlotState::FREE) {
        busy += str(busy.empty() ? "" : ", ", "buffer ", s.index, " ", slot_state_name(s.state));
      }
    }
    if (!busy.empty()) {
      violate("every AllocTensor is FreeTensor'd (and every EnQue DeQue'd) by kernel end", api,
              str(q.name(), " still holds ", busy));
    }
  }
}

// What the launcher checks when a block's kernel function returns.
inline void check_end_of_kernel(BlockContext& c) {
  check_queues_idle(c, "kernel end");
  for (const auto& [key, count] : c.flags) {
    if (count != 0) {
      violate("SetFlag/WaitFlag pairing", "kernel end",
              str(count, " SetFlag on HardEvent ", key.first, ", event id ", key.second,
                  " never waited (WaitFlag)"));
    }
  }
  if (c.atomic != AtomicMode::NONE) {
    violate("SetAtomicNone after atomic accumulation", "kernel end",
            "the kernel returned with atomic accumulation still enabled; call SetAtomicNone() / "
            "DisableDmaAtomic() (SetAtomicAdd's page asks for it so later copies are not affected)");
  }
}

}  // namespace ascendc_emu

#endif  // ASCENDC_EMU_CONTEXT_H
