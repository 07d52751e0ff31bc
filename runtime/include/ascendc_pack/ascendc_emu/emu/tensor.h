// ascendc_emu: GlobalTensor, LocalTensor, TPipe, TQue, TBuf, block ids and synchronisation.
#ifndef ASCENDC_EMU_TENSOR_H
#define ASCENDC_EMU_TENSOR_H

#include <cstdint>
#include <type_traits>

#include "context.h"

namespace AscendC {

template <class T>
class LocalTensor;

// ------------------------------------------------------------------------------ GlobalTensor
template <class T>
class GlobalTensor {
 public:
  using PrimType = T;
  GlobalTensor() = default;

  void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize) {
    addr_ = buffer;
    size_ = bufferSize;
    sized_ = true;
  }
  void SetGlobalBuffer(__gm__ T* buffer) {
    addr_ = buffer;
    size_ = 0;
    sized_ = false;  // GetSize() is 0 and only the launch's buffer sizes bound the accesses
  }
  uint64_t GetSize() const { return size_; }
  __gm__ T* GetPhyAddr() const { return addr_; }
  __gm__ T* GetPhyAddr(uint64_t offset) const { return addr_ + offset; }

  GlobalTensor operator[](uint64_t offset) const {
    if (sized_ && offset > size_) {
      ascendc_emu::violate("GlobalTensor bounds", "GlobalTensor::operator[]",
                           ascendc_emu::str("offset ", offset, " beyond SetGlobalBuffer size ", size_));
    }
    GlobalTensor g = *this;
    g.addr_ = addr_ + offset;
    g.size_ = sized_ ? size_ - offset : 0;
    return g;
  }
  T GetValue(uint64_t index) const { return *checked(index, "GlobalTensor::GetValue"); }
  void SetValue(uint64_t index, const T& value) const {
    *checked(index, "GlobalTensor::SetValue") = value;
  }
  T& operator()(uint64_t index) const { return *checked(index, "GlobalTensor::operator()"); }

  bool emu_sized() const { return sized_; }
  // Emulator internal: checks `count` elements from the start against the known sizes.
  void emu_check(const std::string& api, uint64_t count, uint32_t align = sizeof(T) > 8 ? 8 : sizeof(T)) const {
    if (addr_ == nullptr) {
      ascendc_emu::violate("GlobalTensor set before use", api, "SetGlobalBuffer was never called");
    }
    if (sized_ && count > size_) {
      ascendc_emu::violate("GlobalTensor bounds", api,
                           ascendc_emu::str(count, " elements accessed, SetGlobalBuffer gave ", size_));
    }
    ascendc_emu::check_gm(api, addr_, count * sizeof(T), align);
  }

 private:
  T* checked(uint64_t index, const char* api) const {
    emu_check(api, index + 1);
    return addr_ + index;
  }
  T* addr_ = nullptr;
  uint64_t size_ = 0;
  bool sized_ = false;
};

// ------------------------------------------------------------------------------- LocalTensor
template <class T>
class LocalTensor {
 public:
  using PrimType = T;
  LocalTensor() = default;

  uint32_t GetSize() const { return size_; }
  uint32_t GetLength() const { return size_ * sizeof(T); }
  void SetSize(uint32_t size) {
    if (static_cast<uint64_t>(size) * sizeof(T) > cap_bytes_) {
      ascendc_emu::violate("LocalTensor bounds", "LocalTensor::SetSize",
                           ascendc_emu::str("size ", size, " x ", sizeof(T), " B exceeds the ",
                                            cap_bytes_, " B of the underlying buffer"));
    }
    size_ = size;
  }
  TPosition GetPosition() const { return pos_; }
  __ubuf__ T* GetPhyAddr() const { return reinterpret_cast<T*>(addr_); }
  __ubuf__ T* GetPhyAddr(uint32_t offset) const { return reinterpret_cast<T*>(addr_) + offset; }

  LocalTensor operator[](uint32_t offset) const {
    if (offset > size_) {
      ascendc_emu::violate("LocalTensor bounds", "LocalTensor::operator[]",
                           ascendc_emu::str("offset ", offset, " beyond the tensor's ", size_,
                                            " elements"));
    }
    LocalTensor t = *this;
    t.addr_ += static_cast<uint64_t>(offset) * sizeof(T);
    t.size_ = size_ - offset;
    t.cap_bytes_ = cap_bytes_ - static_cast<uint64_t>(offset) * sizeof(T);
    return t;
  }
  template <class U>
  LocalTensor<U> ReinterpretCast() const {
    LocalTensor<U> t;
    t.emu_init(addr_, static_cast<uint32_t>(static_cast<uint64_t>(size_) * sizeof(T) / sizeof(U)),
               cap_bytes_, slot_, generation_, pos_);
    return t;
  }
  T GetValue(uint32_t index) const { return *element(index, "LocalTensor::GetValue"); }
  void SetValue(uint32_t index, const T& value) const {
    *element(index, "LocalTensor::SetValue") = value;
  }
  T& operator()(uint32_t index) const { return *element(index, "LocalTensor::operator()"); }

  // Emulator internals.
  void emu_init(uint8_t* addr, uint32_t size, uint64_t cap_bytes, ascendc_emu::BufferSlot* slot,
                uint32_t generation, TPosition pos) {
    addr_ = addr;
    size_ = size;
    cap_bytes_ = cap_bytes;
    slot_ = slot;
    generation_ = generation;
    pos_ = pos;
  }
  ascendc_emu::UbView emu_view() const {
    return {addr_, static_cast<uint64_t>(size_) * sizeof(T), slot_, generation_};
  }
  // Checks the first `count` elements may be accessed and returns them.
  T* emu_data(const std::string& api, const char* operand, int64_t count,
              uint32_t align = ascendc_emu::kBlockBytes) const {
    if (count < 0) {
      ascendc_emu::violate("non-negative element counts", api,
                           ascendc_emu::str(operand, " count is ", count));
    }
    ascendc_emu::check_ub(api, operand, emu_view(), static_cast<uint64_t>(count) * sizeof(T), align);
    return reinterpret_cast<T*>(addr_);
  }
  ascendc_emu::BufferSlot* emu_slot() const { return slot_; }

 private:
  T* element(uint32_t index, const char* api) const {
    return emu_data(api, "tensor", static_cast<int64_t>(index) + 1, alignof(T)) + index;
  }
  uint8_t* addr_ = nullptr;
  uint32_t size_ = 0;
  uint64_t cap_bytes_ = 0;
  ascendc_emu::BufferSlot* slot_ = nullptr;
  uint32_t generation_ = 0;
  TPosition pos_ = TPosition::VECCALC;
};

// ------------------------------------------------------------------------------ TQue / TBuf
template <TPosition pos, int32_t depth, auto mask = 0>
class TQue {
  static_assert(pos == TPosition::VECIN || pos == TPosition::VECOUT || pos == TPosition::VECCALC,
                "ascendc_emu emulates Vector queues only (TPosition VECIN/VECOUT/VECCALC)");
  static_assert(depth >= 1, "ascendc_emu: depth 0 (in-place AllocTensor/DeQue) is not emulated");

 public:
  TQue() = default;
  TQue(const TQue&) = delete;
  TQue& operator=(const TQue&) = delete;

  template <class T>
  LocalTensor<T> AllocTensor() {
    auto& q = state("TQue::AllocTensor");
    for (auto& s : q.slots) {
      if (s.state == ascendc_emu::SlotState::FREE) {
        s.state = ascendc_emu::SlotState::ALLOCATED;
        // AllocTensor waits for the event FreeTensor set: every pipe that used this buffer before
        // (and what those pipes waited for) is done with it.
        ascendc_emu::forget_range(ascendc_emu::ctx(), s.addr, s.bytes);
        return tensor_of<T>(s);
      }
    }
    ascendc_emu::violate("AllocTensor needs an idle buffer", "TQue::AllocTensor",
                         ascendc_emu::str("all ", q.slots.size(), " buffers of ", q.name(),
                                          " are in use; FreeTensor one first (or InitBuffer more)"));
  }

  template <class T>
  bool EnQue(const LocalTensor<T>& tensor) {
    auto& q = state("TQue::EnQue");
    auto* s = own_slot(q, tensor, "TQue::EnQue");
    if (s->state == ascendc_emu::SlotState::ENQUEUED) {
      ascendc_emu::violate("EnQue/DeQue pairing", "TQue::EnQue",
                           ascendc_emu::str("buffer ", s->index, " of ", q.name(), " is already queued"));
    }
    if (static_cast<int32_t>(q.fifo.size()) >= depth) {
      ascendc_emu::violate("queue depth", "TQue::EnQue",
                           ascendc_emu::str(q.name(), " already holds ", q.fifo.size(),
                                            " EnQue'd tensor(s) = its depth; DeQue before the next EnQue"));
    }
    s->state = ascendc_emu::SlotState::ENQUEUED;
    s->enque_insn = ascendc_emu::ctx().insn;
    q.fifo.push_back(s);
    return true;
  }

  template <class T>
  LocalTensor<T> DeQue() {
    auto& q = state("TQue::DeQue");
    if (q.fifo.empty()) {
      ascendc_emu::violate("EnQue/DeQue pairing", "TQue::DeQue",
                           ascendc_emu::str("DeQue of an empty queue: ", q.name(),
                                            " has no EnQue'd tensor (the device would hang)"));
    }
    auto* s = q.fifo.front();
    q.fifo.pop_front();
    s->state = ascendc_emu::SlotState::DEQUEUED;
    auto& c = ascendc_emu::ctx();  // DeQue waits for the event its EnQue set (MTE2->V, V->MTE3)
    if constexpr (pos == TPosition::VECIN) ascendc_emu::forget_before(c.mte2_pending, s->enque_insn);
    if constexpr (pos == TPosition::VECOUT) ascendc_emu::forget_before(c.v_unsynced_mte3, s->enque_insn);
    return tensor_of<T>(*s);
  }

  template <class T>
  void FreeTensor(LocalTensor<T>& tensor) {
    auto& q = state("TQue::FreeTensor");
    auto* s = own_slot(q, tensor, "TQue::FreeTensor");
    if (s->state == ascendc_emu::SlotState::ENQUEUED) {
      ascendc_emu::violate("EnQue/DeQue pairing", "TQue::FreeTensor",
                           ascendc_emu::str("buffer ", s->index, " of ", q.name(),
                                            " is still queued; DeQue it before FreeTensor"));
    }
    s->state = ascendc_emu::SlotState::FREE;
    ++s->generation;
  }

  bool VacantInQue() { return static_cast<int32_t>(state("TQue::VacantInQue").fifo.size()) < depth; }
  bool HasTensorInQue() { return !state("TQue::HasTensorInQue").fifo.empty(); }
  int32_t GetTensorCountInQue() { return static_cast<int32_t>(state("TQue::GetTensorCountInQue").fifo.size()); }
  bool HasIdleBuffer() {
    for (const auto& s : state("TQue::HasIdleBuffer").slots) {
      if (s.state == ascendc_emu::SlotState::FREE) return true;
    }
    return false;
  }
  void FreeAllEvent() {}

  // Emulator internal (TPipe::InitBuffer).
  ascendc_emu::QueueState* emu_state = nullptr;

 private:
  ascendc_emu::QueueState& state(const char* api) {
    if (emu_state == nullptr || emu_state->retired) {
      ascendc_emu::violate("TPipe::InitBuffer before queue use", api,
                           emu_state == nullptr ? "the queue was never InitBuffer'd"
                                                : "the queue's TPipe was Reset or destroyed since InitBuffer");
    }
    return *emu_state;
  }
  template <class T>
  static LocalTensor<T> tensor_of(ascendc_emu::BufferSlot& s) {
    LocalTensor<T> t;
    t.emu_init(s.addr, static_cast<uint32_t>(s.bytes / sizeof(T)), s.bytes, &s, s.generation, pos);
    return t;
  }
  template <class T>
  static ascendc_emu::BufferSlot* own_slot(ascendc_emu::QueueState& q, const LocalTensor<T>& t,
                                           const char* api) {
    auto* s = t.emu_slot();
    if (s == nullptr || s->owner != &q) {
      ascendc_emu::violate("tensors return to the queue they came from", api,
                           ascendc_emu::str("the tensor was not allocated from ", q.name()));
    }
    if (s->state == ascendc_emu::SlotState::FREE || t.emu_view().generation != s->generation) {
      ascendc_emu::violate("no use after FreeTensor", api,
                           ascendc_emu::str("buffer ", s->index, " of ", q.name(), " was already freed"));
    }
    return s;
  }
};

template <TPosition pos = TPosition::VECCALC>
class TBuf {
  static_assert(pos == TPosition::VECIN || pos == TPosition::VECOUT || pos == TPosition::VECCALC,
                "ascendc_emu emulates Vector buffers only (TPosition VECIN/VECOUT/VECCALC)");

 public:
  TBuf() = default;
  TBuf(const TBuf&) = delete;
  TBuf& operator=(const TBuf&) = delete;

  template <class T>
  LocalTensor<T> Get() {
    check("TBuf::Get");
    return make<T>(0, bytes_ / sizeof(T));
  }
  template <class T>
  LocalTensor<T> Get(uint32_t len) {
    check("TBuf::Get");
    if (static_cast<uint64_t>(len) * sizeof(T) > bytes_) {
      ascendc_emu::violate("TBuf::Get length within InitBuffer length", "TBuf::Get",
                           ascendc_emu::str(len, " x ", sizeof(T), " B > the ", bytes_, " B InitBuffer gave"));
    }
    return make<T>(0, len);
  }
  template <class T>
  LocalTensor<T> GetWithOffset(uint32_t size, uint32_t bufOffset) {
    check("TBuf::GetWithOffset");
    if (bufOffset % ascendc_emu::kBlockBytes != 0 ||
        bufOffset + static_cast<uint64_t>(size) * sizeof(T) > bytes_) {
      ascendc_emu::violate("TBuf::GetWithOffset within the buffer, 32 B aligned", "TBuf::GetWithOffset",
                           ascendc_emu::str("offset ", bufOffset, " B + ", size, " x ", sizeof(T),
                                            " B in a ", bytes_, " B buffer"));
    }
    return make<T>(bufOffset, size);
  }

  // Emulator internal (TPipe::InitBuffer).
  void emu_init(uint8_t* addr, uint32_t bytes) {
    addr_ = addr;
    bytes_ = bytes;
    epoch_ = ascendc_emu::ctx().pipe_epoch;
  }
  bool emu_initialized() const { return addr_ != nullptr && epoch_ == ascendc_emu::ctx().pipe_epoch; }

 private:
  void check(const char* api) const {
    if (!emu_initialized()) {
      ascendc_emu::violate("TPipe::InitBuffer before buffer use", api,
                           addr_ == nullptr ? "the TBuf was never InitBuffer'd"
                                            : "the TBuf's TPipe was Reset or destroyed since InitBuffer");
    }
  }
  template <class T>
  LocalTensor<T> make(uint32_t offset, uint32_t size) const {
    LocalTensor<T> t;
    t.emu_init(addr_ + offset, size, bytes_ - offset, nullptr, 0, pos);
    return t;
  }
  uint8_t* addr_ = nullptr;
  uint32_t bytes_ = 0;
  uint32_t epoch_ = 0;
};

// ------------------------------------------------------------------------------------ TPipe
class TPipe {
 public:
  TPipe() {
    auto& c = ascendc_emu::ctx();
    if (c.pipe != nullptr) {
      ascendc_emu::violate("one TPipe per kernel", "TPipe::TPipe",
                           "a second TPipe was created while one is alive (the device hangs or "
                           "corrupts memory); Destroy() the first one");
    }
    c.pipe = this;
  }
  ~TPipe() { Destroy(); }
  TPipe(const TPipe&) = delete;
  TPipe& operator=(const TPipe&) = delete;

  template <TPosition pos, int32_t depth, auto mask>
  bool InitBuffer(TQue<pos, depth, mask>& que, uint8_t num, uint32_t len) {
    const std::string api = "TPipe::InitBuffer";
    auto& c = live(api);
    if (que.emu_state != nullptr && !que.emu_state->retired) {
      ascendc_emu::violate("InitBuffer once per queue", api, que.emu_state->name() + " was already initialised");
    }
    if (num == 0 || len == 0) {
      ascendc_emu::violate("InitBuffer with num >= 1 and len >= 1", api,
                           ascendc_emu::str("num=", unsigned(num), ", len=", len));
    }
    const uint32_t aligned = round_up(len);
    auto& per_pos = c.que_buffers[static_cast<unsigned>(pos)];
    if (per_pos + num > c.launch().soc->que_buffers_per_position) {
      ascendc_emu::violate("TQue buffers per TPosition", api,
                           ascendc_emu::str(per_pos + num, " TQue buffers on ", ascendc_emu::position_name(pos),
                                            " exceed the ", c.launch().soc->que_buffers_per_position,
                                            " eventIDs of ", c.launch().soc->name));
    }
    uint8_t* base = reserve(c, api, static_cast<uint64_t>(num) * aligned, num,
                            ascendc_emu::str("InitBuffer(queue on ", ascendc_emu::position_name(pos),
                                             ", num=", unsigned(num), ", len=", len, ")"));
    per_pos += num;
    auto& q = c.queues.emplace_back();
    q.id = static_cast<uint32_t>(c.queues.size());
    q.pos = pos;
    q.depth = depth;
    q.len = aligned;
    q.retired = false;
    for (uint32_t i = 0; i < num; ++i) {
      q.slots.push_back({base + static_cast<uint64_t>(i) * aligned, aligned,
                         ascendc_emu::SlotState::FREE, 0, &q, i});
    }
    que.emu_state = &q;
    return true;
  }

  template <TPosition pos>
  bool InitBuffer(TBuf<pos>& buf, uint32_t len) {
    const std::string api = "TPipe::InitBuffer";
    auto& c = live(api);
    if (buf.emu_initialized()) ascendc_emu::violate("InitBuffer once per buffer", api, "TBuf already initialised");
    if (len == 0) ascendc_emu::violate("InitBuffer with len >= 1", api, "len=0");
    const uint32_t aligned = round_up(len);
    buf.emu_init(reserve(c, api, aligned, 1, ascendc_emu::str("InitBuffer(TBuf, len=", len, ")")), aligned);
    return true;
  }

  // Releases every buffer (the queues must be idle) so InitBuffer can start over.
  void Reset() {
    auto& c = live("TPipe::Reset");
    ascendc_emu::check_queues_idle(c, "TPipe::Reset");
    c.release_buffers();
  }
  void Destroy() {
    auto* c = ascendc_emu::tls_block;
    if (c != nullptr && c->pipe == this) {
      c->release_buffers();
      c->pipe = nullptr;
    }
  }

  TEventID FetchEventID(HardEvent) { return 0; }
  template <HardEvent evt>
  TEventID FetchEventID() { return 0; }
  template <HardEvent evt>
  TEventID AllocEventID() { return 0; }
  template <HardEvent evt>
  void ReleaseEventID(TEventID) {}

 private:
  static uint32_t round_up(uint32_t len) {
    return (len + ascendc_emu::kBlockBytes - 1) / ascendc_emu::kBlockBytes * ascendc_emu::kBlockBytes;
  }
  ascendc_emu::BlockContext& live(const std::string& api) {
    auto& c = ascendc_emu::ctx();
    if (c.pipe != this) ascendc_emu::violate("one TPipe per kernel", api, "this TPipe was destroyed");
    return c;
  }
  static uint8_t* reserve(ascendc_emu::BlockContext& c, const std::string& api, uint64_t bytes,
                          uint32_t buffers, const std::string& what) {
    if (c.buffers_used + buffers > ascendc_emu::kMaxBuffersPerKernel) {
      ascendc_emu::violate("at most 64 buffers per kernel", api,
                           ascendc_emu::str(what, " brings the kernel to ", c.buffers_used + buffers, " buffers"));
    }
    if (c.ub_used + bytes > c.launch().ub_usable) {
      ascendc_emu::violate("Unified Buffer capacity", api,
                           ascendc_emu::str(what, " needs ", bytes, " B but only ",
                                            c.launch().ub_usable - c.ub_used, " of the ",
                                            c.launch().ub_usable, " usable UB bytes are left (",
                                            c.launch().soc->name, ": ", c.launch().soc->ub_bytes,
                                            " B UB per vector core minus framework reserve)"));
    }
    uint8_t* p = c.ub() + c.ub_used;
    c.ub_used += static_cast<uint32_t>(bytes);
    c.buffers_used += buffers;
    return p;
  }
};

inline TPipe* GetTPipePtr() {
  auto& c = ascendc_emu::ctx();
  if (c.pipe == nullptr) ascendc_emu::violate("one TPipe per kernel", "GetTPipePtr", "no TPipe is alive");
  return static_cast<TPipe*>(c.pipe);
}

// -------------------------------------------------------------------------- block identity
inline int64_t GetBlockIdx() { return ascendc_emu::ctx().block_idx(); }
inline int64_t GetBlockNum() { return ascendc_emu::ctx().launch().block_dim; }
inline int64_t GetSubBlockIdx() { return 0; }
inline int64_t GetSubBlockNum() { return 1; }
// The device's workspace semantics (asc-devkit impl/basic_api/dav_c220/kernel_operator_common_impl.h):
// GetUserWorkspace ignores its argument and returns the system workspace (SetSysWorkspace, or the
// framework with HAVE_WORKSPACE) + RESERVED_WORKSPACE, 16 MiB on arch 2201. Without a system
// workspace the device returns nullptr + 16 MiB; with one, the host must have allocated the
// reserve in front of the user's bytes.
inline void SetSysWorkspace(GM_ADDR workspace) {
  auto& c = ascendc_emu::ctx();
  if (c.sys_workspace == nullptr) c.sys_workspace = workspace;
}
inline GM_ADDR GetUserWorkspace(GM_ADDR workspace) {
  auto& c = ascendc_emu::ctx();
  const char* doc = " [AscendC API reference: GetUserWorkspace; programming guide: how to use workspace]";
  if (c.sys_workspace == nullptr) {
    ascendc_emu::violate("GetUserWorkspace needs a system workspace", "GetUserWorkspace",
                         ascendc_emu::str("no SetSysWorkspace (and no HAVE_WORKSPACE framework) set one, so on the "
                                          "device it returns nullptr + RESERVED_WORKSPACE (",
                                          ASCENDC_EMU_RESERVED_WORKSPACE,
                                          " B), not the argument; use the kernel's workspace argument directly, or "
                                          "SetSysWorkspace it and allocate the reserve",
                                          doc));
  }
  (void)workspace;
  GM_ADDR user = c.sys_workspace + ASCENDC_EMU_RESERVED_WORKSPACE;
  for (const auto& r : c.launch().gm) {
    if (r.base == c.sys_workspace && r.bytes != 0 && r.bytes <= ASCENDC_EMU_RESERVED_WORKSPACE) {
      ascendc_emu::violate("the host allocates system + user workspace", "GetUserWorkspace",
                           ascendc_emu::str("the workspace argument holds ", r.bytes,
                                            " B but the user workspace starts RESERVED_WORKSPACE = ",
                                            ASCENDC_EMU_RESERVED_WORKSPACE,
                                            " B into it: allocate the reserve plus the user bytes", doc));
    }
  }
  return user;
}

}  // namespace AscendC

namespace ascendc_emu {
// KERNEL_TASK_TYPE_DEFAULT(value): the kernel type of this block's kernel.
inline void set_kernel_type(int value) { ctx().kernel_type = value; }
}  // namespace ascendc_emu

namespace AscendC {

// --------------------------------------------------------------------------- synchronisation
// PipeBarrier<PIPE_V>() orders the Vector pipe (dependent vector instructions); PIPE_ALL waits for
// every pipe. The emulation forgets the ranges in flight that the barrier completes.
template <pipe_t pipe>
inline void PipeBarrier() {
  auto& c = ascendc_emu::ctx();
  if (pipe == PIPE_V || pipe == PIPE_ALL) {
    c.v_writes.clear();
    c.v_reads.clear();
  }
  if (pipe == PIPE_ALL) {
    c.v_unsynced_s.clear();
    c.v_unsynced_mte3.clear();
    c.mte2_pending.clear();
  }
}

namespace detail_sync {
inline void set_flag(int key, int32_t id, const char* api) {
  if (id < 0 || static_cast<uint32_t>(id) >= ascendc_emu::kEventIdsPerHardEvent) {
    ascendc_emu::violate("event id in [0, 8)", api, ascendc_emu::str("event id ", id));
  }
  ++ascendc_emu::ctx().flags[{key, id}];
}
inline void wait_flag(int key, int32_t id, const char* api) {
  auto& n = ascendc_emu::ctx().flags[{key, id}];
  if (n == 0) {
    ascendc_emu::violate("SetFlag/WaitFlag pairing", api,
                         ascendc_emu::str("WaitFlag on event ", key, ", id ", id,
                                          " with no pending SetFlag (the device would hang)"));
  }
  --n;
}
}  // namespace detail_sync

template <HardEvent event>
inline void SetFlag(int32_t eventID) {
  detail_sync::set_flag(static_cast<int>(event), eventID, "SetFlag");
}
template <HardEvent event>
inline void WaitFlag(int32_t eventID) {
  detail_sync::wait_flag(static_cast<int>(event), eventID, "WaitFlag");
  auto& c = ascendc_emu::ctx();  // the waiting pipe now sees what the signalling pipe finished
  if (event == HardEvent::MTE2_V || event == HardEvent::MTE2_S) c.mte2_pending.clear();
  if (event == HardEvent::V_MTE3) c.v_unsynced_mte3.clear();
  if (event == HardEvent::V_S) {  // the scalar unit waited for the V pipe: it is drained
    c.v_unsynced_s.clear();
    c.v_writes.clear();
    c.v_reads.clear();
  }
}

template <pipe_t src, pipe_t dst>
class TQueSync {
 public:
  void SetFlag(TEventID id) { detail_sync::set_flag(1000 + src * 16 + dst, id, "TQueSync::SetFlag"); }
  void WaitFlag(TEventID id) { detail_sync::wait_flag(1000 + src * 16 + dst, id, "TQueSync::WaitFlag"); }
};

// Hard all-core barrier of a Vector kernel. Every block of the launch must reach it, and all blocks
// must be resident at once, so block_dim may not exceed the SoC's vector-core count.
template <bool isAIVOnly = true>
inline void SyncAll() {
  static_assert(isAIVOnly, "ascendc_emu emulates Vector-only kernels (SyncAll<true>)");
  auto& c = ascendc_emu::ctx();
  if (c.kernel_type != KERNEL_TYPE_MIX_AIV_1_0 && c.kernel_type != KERNEL_TYPE_MIX_AIC_1_1 &&
      c.kernel_type != KERNEL_TYPE_MIX_AIC_1_2) {
    ascendc_emu::violate("SyncAll needs a MIX kernel type", "SyncAll",
                         "the hard all-core barrier of a Vector kernel works only in a kernel of type "
                         "KERNEL_TYPE_MIX_AIV_1_0 (KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0); in CANN 9.x "
                         "also __mix__(0, 1)); in a plain AIV kernel the cores never meet (hang or address "
                         "exception) [AscendC API reference: SyncAll constraints; Set kernel type]");
  }
  if (c.launch().block_dim > c.launch().soc->vector_cores) {
    ascendc_emu::violate("SyncAll needs block_dim <= vector cores", "SyncAll",
                         ascendc_emu::str("block_dim ", c.launch().block_dim, " > the ",
                                          c.launch().soc->vector_cores, " vector cores of ",
                                          c.launch().soc->name, ": the blocks cannot all be resident"));
  }
  c.launch().sync->sync_all(c.block_idx());
  PipeBarrier<PIPE_ALL>();  // every pipe of every core has finished what it issued before
}

}  // namespace AscendC

#endif  // ASCENDC_EMU_TENSOR_H
