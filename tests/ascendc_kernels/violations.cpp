// Kernels that each break one documented AscendC rule; the emulator must stop them with a message
// naming the rule. All take (GM_ADDR x, GM_ADDR out) with x and out float[1024] unless noted.
#include "kernel_operator.h"

using namespace AscendC;

namespace {

struct Fixture {
  TPipe pipe;
  TQue<QuePosition::VECIN, 1> inQ;
  TQue<QuePosition::VECOUT, 1> outQ;
  GlobalTensor<float> xGm, outGm;
  Fixture(GM_ADDR x, GM_ADDR out, uint32_t len = 256) {
    xGm.SetGlobalBuffer((__gm__ float*)x, 1024);
    outGm.SetGlobalBuffer((__gm__ float*)out, 1024);
    pipe.InitBuffer(inQ, 1, len * sizeof(float));
    pipe.InitBuffer(outQ, 1, len * sizeof(float));
  }
};

}  // namespace

// 10 floats = 40 bytes: DataCopy moves whole 32-byte blocks only.
extern "C" __global__ __aicore__ void v_datacopy_length(GM_ADDR x, GM_ADDR out) {
  Fixture f(x, out);
  LocalTensor<float> t = f.inQ.AllocTensor<float>();
  DataCopy(t, f.xGm, 10);
  f.inQ.FreeTensor(t);
}

// A UB operand 12 bytes into its buffer.
extern "C" __global__ __aicore__ void v_datacopy_ub_address(GM_ADDR x, GM_ADDR out) {
  Fixture f(x, out);
  LocalTensor<float> t = f.inQ.AllocTensor<float>();
  DataCopy(t[3], f.xGm, 8);
  f.inQ.FreeTensor(t);
}

// 2 x 100 KiB of queue buffers on a 192 KiB UB.
extern "C" __global__ __aicore__ void v_ub_capacity(GM_ADDR, GM_ADDR) {
  TPipe pipe;
  TQue<QuePosition::VECIN, 2> q;
  pipe.InitBuffer(q, 2, 100 * 1024);
}

// Fits only when the 8 KiB ASC scratch area is not reserved (186 KiB).
extern "C" __global__ __aicore__ void v_ub_186k(GM_ADDR, GM_ADDR) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> b;
  pipe.InitBuffer(b, 186 * 1024);
}

extern "C" __global__ __aicore__ void v_deque_empty(GM_ADDR x, GM_ADDR out) {
  Fixture f(x, out);
  LocalTensor<float> t = f.inQ.DeQue<float>();
  f.inQ.FreeTensor(t);
}

// Two EnQue without a DeQue on a depth-1 queue.
extern "C" __global__ __aicore__ void v_enque_depth(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TQue<QuePosition::VECIN, 1> q;
  pipe.InitBuffer(q, 2, 1024);
  LocalTensor<float> a = q.AllocTensor<float>();
  LocalTensor<float> b = q.AllocTensor<float>();
  q.EnQue(a);
  q.EnQue(b);
}

// A second AllocTensor on a queue with one buffer.
extern "C" __global__ __aicore__ void v_alloc_beyond_num(GM_ADDR x, GM_ADDR out) {
  Fixture f(x, out);
  LocalTensor<float> a = f.inQ.AllocTensor<float>();
  LocalTensor<float> b = f.inQ.AllocTensor<float>();
  f.inQ.FreeTensor(a);
  f.inQ.FreeTensor(b);
}

// The kernel returns with a tensor still allocated.
extern "C" __global__ __aicore__ void v_not_freed(GM_ADDR x, GM_ADDR out) {
  Fixture f(x, out);
  LocalTensor<float> t = f.inQ.AllocTensor<float>();
  DataCopy(t, f.xGm, 256);
  f.inQ.EnQue(t);
}

// Computing on a tensor between EnQue and DeQue.
extern "C" __global__ __aicore__ void v_use_while_queued(GM_ADDR x, GM_ADDR out) {
  Fixture f(x, out);
  LocalTensor<float> t = f.inQ.AllocTensor<float>();
  DataCopy(t, f.xGm, 256);
  f.inQ.EnQue(t);
  Adds(t, t, 1.0f, 256);
}

extern "C" __global__ __aicore__ void v_use_after_free(GM_ADDR x, GM_ADDR out) {
  Fixture f(x, out);
  LocalTensor<float> t = f.inQ.AllocTensor<float>();
  f.inQ.FreeTensor(t);
  Duplicate(t, 1.0f, 64);
}

// count 300 on tensors of 256 elements.
extern "C" __global__ __aicore__ void v_vector_count_oob(GM_ADDR x, GM_ADDR out) {
  Fixture f(x, out);
  LocalTensor<float> a = f.inQ.AllocTensor<float>();
  LocalTensor<float> o = f.outQ.AllocTensor<float>();
  Add(o, a, a, 300);
  f.inQ.FreeTensor(a);
  f.outQ.FreeTensor(o);
}

// An offset sub-tensor whose remaining length is too short for the count.
extern "C" __global__ __aicore__ void v_vector_offset_oob(GM_ADDR x, GM_ADDR out) {
  Fixture f(x, out);
  LocalTensor<float> a = f.inQ.AllocTensor<float>();
  Exp(a[192], a[192], 128);
  f.inQ.FreeTensor(a);
}

// dst [8, 264) partially overlaps src [0, 256).
extern "C" __global__ __aicore__ void v_partial_overlap(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> b;
  pipe.InitBuffer(b, 512 * sizeof(float));
  LocalTensor<float> t = b.Get<float>();
  Muls(t[8], t, 2.0f, 256);
}

// ReduceMax of 4096 floats needs ceil(2 * 64 / 8) * 8 = 128 floats of work space; 64 given.
extern "C" __global__ __aicore__ void v_reduce_work(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> src, work, dst;
  pipe.InitBuffer(src, 4096 * sizeof(float));
  pipe.InitBuffer(work, 64 * sizeof(float));
  pipe.InitBuffer(dst, 8 * sizeof(float));
  ReduceMax(dst.Get<float>(), src.Get<float>(), work.Get<float>(), 4096);
}

// Compare of 100 floats: not a whole number of 256-byte repeats.
extern "C" __global__ __aicore__ void v_compare_count(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> a, m;
  pipe.InitBuffer(a, 128 * sizeof(float));
  pipe.InitBuffer(m, 32);
  CompareScalar(m.Get<uint8_t>(), a.Get<float>(), 0.0f, CMPMODE::GT, 100);
}

extern "C" __global__ __aicore__ void v_waitflag(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  WaitFlag<HardEvent::MTE2_V>(EVENT_ID0);
}

extern "C" __global__ __aicore__ void v_setflag_unpaired(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  SetFlag<HardEvent::V_MTE3>(EVENT_ID1);
}

// Block 1 returns early; the others wait in SyncAll.
extern "C" __global__ __aicore__ void v_syncall_skipped(GM_ADDR x, GM_ADDR out) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0);
  TPipe pipe;
  if (GetBlockIdx() == 1) return;
  SyncAll();
}

// Any kernel with SyncAll: block_dim must fit the vector cores.
extern "C" __global__ __aicore__ void v_syncall_ok(GM_ADDR x, GM_ADDR out) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0);
  TPipe pipe;
  SyncAll();
  SyncAll();
}

// float -> bfloat16_t has no CAST_NONE on Atlas A2/A3.
extern "C" __global__ __aicore__ void v_cast_round_mode(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> a, b;
  pipe.InitBuffer(a, 64 * sizeof(float));
  pipe.InitBuffer(b, 64 * sizeof(bfloat16_t));
  Cast(b.Get<bfloat16_t>(), a.Get<float>(), RoundMode::CAST_NONE, 64);
}

extern "C" __global__ __aicore__ void v_two_pipes(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TPipe second;
}

// Reads 1024 + 8 floats from a 1024-float argument.
extern "C" __global__ __aicore__ void v_gm_oob(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> b;
  pipe.InitBuffer(b, 1032 * sizeof(float));
  GlobalTensor<float> g;
  g.SetGlobalBuffer((__gm__ float*)x);
  DataCopy(b.Get<float>(), g, 1032);
}

// 9 TQue buffers on VECIN; Atlas A2 has 8 eventIDs per position.
extern "C" __global__ __aicore__ void v_que_buffers(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TQue<QuePosition::VECIN, 1> q0, q1, q2, q3, q4;
  pipe.InitBuffer(q0, 2, 256);
  pipe.InitBuffer(q1, 2, 256);
  pipe.InitBuffer(q2, 2, 256);
  pipe.InitBuffer(q3, 2, 256);
  pipe.InitBuffer(q4, 1, 256);
}

// Select with a scalar (mode 1) needs the 8 KiB ASC scratch area.
extern "C" __global__ __aicore__ void v_select_scalar(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> a, m;
  pipe.InitBuffer(a, 64 * sizeof(float));
  pipe.InitBuffer(m, 32);
  Select(a.Get<float>(), m.Get<uint8_t>(), a.Get<float>(), 1.0f, SELMODE::VSEL_TENSOR_SCALAR_MODE, 64);
}

// Only block 2 misbehaves (TBuf::Get beyond the buffer): the message names it.
extern "C" __global__ __aicore__ void v_block_two(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TBuf<TPosition::VECCALC> b;
  pipe.InitBuffer(b, 256 * sizeof(float));
  LocalTensor<float> t = b.Get<float>(GetBlockIdx() == 2 ? 300 : 256);
  Duplicate(t, 0.0f, 256);
}

// A GM read via GlobalTensor::GetValue past SetGlobalBuffer's size.
extern "C" __global__ __aicore__ void v_global_index(GM_ADDR x, GM_ADDR out) {
  GlobalTensor<float> g;
  g.SetGlobalBuffer((__gm__ float*)x, 16);
  (void)g.GetValue(16);
}

// Legal: TPipe::Reset hands the whole UB back for new InitBuffer calls, and so does a new TPipe
// after Destroy().
extern "C" __global__ __aicore__ void ok_pipe_reset(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TQue<QuePosition::VECIN, 1> q;
  TBuf<TPosition::VECCALC> b;
  pipe.InitBuffer(b, 150 * 1024);
  pipe.Reset();
  pipe.InitBuffer(q, 1, 150 * 1024);
  LocalTensor<float> t = q.AllocTensor<float>();
  q.FreeTensor(t);
  pipe.Destroy();
  TPipe second;
  second.InitBuffer(b, 150 * 1024);
  Duplicate(b.Get<float>(), 1.0f, 64);
}

// A queue used after TPipe::Reset without a new InitBuffer.
extern "C" __global__ __aicore__ void v_queue_after_reset(GM_ADDR x, GM_ADDR out) {
  TPipe pipe;
  TQue<QuePosition::VECIN, 1> q;
  pipe.InitBuffer(q, 1, 1024);
  pipe.Reset();
  LocalTensor<float> t = q.AllocTensor<float>();
  q.FreeTensor(t);
}

// SetGlobalBuffer with 0 elements (an idle block's slice), then a copy from it.
extern "C" __global__ __aicore__ void v_global_empty(GM_ADDR x, GM_ADDR out) {
  Fixture f(x, out);
  GlobalTensor<float> g;
  g.SetGlobalBuffer((__gm__ float*)x + 1024, 0);
  LocalTensor<float> t = f.inQ.AllocTensor<float>();
  DataCopy(t, g, 8);
  f.inQ.FreeTensor(t);
}
