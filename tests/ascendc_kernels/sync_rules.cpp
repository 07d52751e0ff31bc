// One kernel per rule of issue 38 that the emulation once missed, each in a racy form (`r_*`,
// expected to abort naming the rule) and, where the fix is a line, a correct twin (`ok_*`).
// Every kernel takes (x, out) float GM buffers of at least 256 floats; `ws_*` take a workspace.
#include "kernel_operator.h"

using namespace AscendC;

namespace {
constexpr uint32_t N = 64;  // one 256-byte repeat of floats
const DataCopyExtParams kRow{1, N * 4, 0, 0, 0};
const DataCopyPadExtParams<float> kNoPad{false, 0, 0, 0};
}  // namespace

// A vector read of a buffer still in flight from MTE2: DataCopyPad GM->UB into a TBuf, then Add
// reads it with no EnQue/DeQue and no SetFlag/WaitFlag<MTE2_V>.
extern "C" __global__ __aicore__ void r_mte2_then_vector(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> buf;
  pipe.InitBuffer(buf, 2 * N * 4);
  GlobalTensor<float> xGm;
  xGm.SetGlobalBuffer((__gm__ float*)x, 256);
  LocalTensor<float> a = buf.Get<float>();
  DataCopyPad(a, xGm, kRow, kNoPad);
  Add(a[N], a, a, N);
}

// The same with the documented MTE2 -> V synchronisation.
extern "C" __global__ __aicore__ void ok_mte2_then_vector(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> buf;
  pipe.InitBuffer(buf, 2 * N * 4);
  GlobalTensor<float> xGm;
  xGm.SetGlobalBuffer((__gm__ float*)x, 256);
  LocalTensor<float> a = buf.Get<float>();
  DataCopyPad(a, xGm, kRow, kNoPad);
  TEventID e = GetTPipePtr()->FetchEventID(HardEvent::MTE2_V);
  SetFlag<HardEvent::MTE2_V>(e);
  WaitFlag<HardEvent::MTE2_V>(e);
  Add(a[N], a, a, N);
}

// A scalar read after vector writes without a V -> S sync.
extern "C" __global__ __aicore__ void r_vector_then_scalar(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> buf;
  pipe.InitBuffer(buf, N * 4);
  LocalTensor<float> a = buf.Get<float>();
  Duplicate(a, 2.0f, N);
  volatile float v = a.GetValue(0);
  (void)v;
}

extern "C" __global__ __aicore__ void ok_vector_then_scalar(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> buf;
  pipe.InitBuffer(buf, N * 4);
  LocalTensor<float> a = buf.Get<float>();
  Duplicate(a, 2.0f, N);
  TEventID e = GetTPipePtr()->FetchEventID(HardEvent::V_S);
  SetFlag<HardEvent::V_S>(e);
  WaitFlag<HardEvent::V_S>(e);
  volatile float v = a.GetValue(0);
  (void)v;
}

// A vector op depending on the previous one with no barrier (auto-sync off): Mul reads what Add wrote.
extern "C" __global__ __aicore__ void r_vector_chain(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> buf;
  pipe.InitBuffer(buf, 3 * N * 4);
  LocalTensor<float> t = buf.Get<float>();
  Duplicate(t, 1.0f, 2 * N);
  PipeBarrier<PIPE_V>();
  Add(t[2 * N], t, t[N], N);
  Mul(t, t[2 * N], t[2 * N], N);
}

extern "C" __global__ __aicore__ void ok_vector_chain(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> buf;
  pipe.InitBuffer(buf, 3 * N * 4);
  LocalTensor<float> t = buf.Get<float>();
  Duplicate(t, 1.0f, 2 * N);
  PipeBarrier<PIPE_V>();
  Add(t[2 * N], t, t[N], N);
  PipeBarrier<PIPE_V>();
  Mul(t, t[2 * N], t[2 * N], N);
}

// A UB -> GM copy of what the Vector unit wrote without V -> MTE3 synchronisation.
extern "C" __global__ __aicore__ void r_vector_then_mte3(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> buf;
  pipe.InitBuffer(buf, N * 4);
  GlobalTensor<float> outGm;
  outGm.SetGlobalBuffer((__gm__ float*)out, 256);
  LocalTensor<float> a = buf.Get<float>();
  Duplicate(a, 3.0f, N);
  DataCopyPad(outGm, a, kRow);
}

// SyncAll in a plain AIV kernel (no KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0)).
extern "C" __global__ __aicore__ void r_syncall_not_mix(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  SyncAll();
}

extern "C" __global__ __aicore__ void ok_syncall_mix(GM_ADDR x, GM_ADDR out) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0);
  TPipe pipe;
  SyncAll();
}

// GetUserWorkspace with no system workspace set (direct invocation without HAVE_WORKSPACE).
extern "C" __global__ __aicore__ void r_user_workspace_unset(GM_ADDR x, GM_ADDR out, GM_ADDR workspace) {
  TPipe pipe;
  GlobalTensor<float> ws;
  ws.SetGlobalBuffer((__gm__ float*)GetUserWorkspace(workspace), 8);
}

// The device's semantics: the user workspace starts RESERVED_WORKSPACE into the system one. The
// kernel writes 8 floats of 7.0 at the user workspace; the host must allocate 16 MiB + 32 B.
extern "C" __global__ __aicore__ void ws_user_workspace(GM_ADDR x, GM_ADDR out, GM_ADDR workspace) {
  TPipe pipe;
  SetSysWorkspace(workspace);
  TQue<QuePosition::VECOUT, 1> q;
  pipe.InitBuffer(q, 1, N * 4);
  GlobalTensor<float> ws;
  ws.SetGlobalBuffer((__gm__ float*)GetUserWorkspace(workspace), 8);
  LocalTensor<float> t = q.AllocTensor<float>();
  Duplicate(t, 7.0f, 8);
  q.EnQue(t);
  t = q.DeQue<float>();
  DataCopyPad(ws, t, DataCopyExtParams{1, 32, 0, 0, 0});
  q.FreeTensor(t);
}

// UB -> UB DataCopy between two VECCALC buffers: not a documented path.
extern "C" __global__ __aicore__ void r_ub_copy_veccalc(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> a, b;
  pipe.InitBuffer(a, N * 4);
  pipe.InitBuffer(b, N * 4);
  DataCopy(b.Get<float>(), a.Get<float>(), N);
}

#ifdef SYNC_RULES_COMPARES
// Compares: in CANN >= 9.0 only (compiled by the test with -DASCENDC_CANN_VERSION=80500 and 90100).
extern "C" __global__ __aicore__ void compares_9x(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> a, m;
  pipe.InitBuffer(a, N * 4);
  pipe.InitBuffer(m, 256);
  Duplicate(a.Get<float>(), 1.0f, N);
  PipeBarrier<PIPE_V>();
  Compares(m.Get<uint8_t>(), a.Get<float>(), 0.0f, CMPMODE::GT, N);
}
#endif
