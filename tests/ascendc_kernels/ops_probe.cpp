// Single-block probes of individual emulated instructions, so the tests can compare each one with
// an independent reference: Cast round modes, Compare/CompareScalar + Select, the count-form reductions,
// WholeReduceSum/Max and DataCopyPad's padding layout. Each entry loads its inputs with DataCopyPad
// into TBuf tensors, runs the instruction(s) and stores the results with DataCopyPad.
#include "kernel_operator.h"

using namespace AscendC;

struct ProbeParams {
  uint32_t n;
  uint32_t arg0;
  uint32_t arg1;
  uint32_t arg2;
  float value;
};

namespace {

ProbeParams Params(GM_ADDR p) { return *reinterpret_cast<__gm__ ProbeParams*>(p); }

template <class T>
LocalTensor<T> Load(TPipe& pipe, TBuf<TPosition::VECCALC>& buf, GM_ADDR src, uint32_t n, uint32_t capacity) {
  pipe.InitBuffer(buf, capacity * sizeof(T));
  LocalTensor<T> t = buf.Get<T>();
  GlobalTensor<T> g;
  g.SetGlobalBuffer((__gm__ T*)src, n);
  DataCopyPad(t, g, DataCopyExtParams{1, static_cast<uint32_t>(n * sizeof(T)), 0, 0, 0},
              DataCopyPadExtParams<T>{false, 0, 0, 0});
  const TEventID e = pipe.FetchEventID(HardEvent::MTE2_V);  // a TBuf has no queue: sync by hand
  SetFlag<HardEvent::MTE2_V>(e);
  WaitFlag<HardEvent::MTE2_V>(e);
  return t;
}

template <class T>
void Store(GM_ADDR dst, const LocalTensor<T>& t, uint32_t n) {
  GlobalTensor<T> g;
  g.SetGlobalBuffer((__gm__ T*)dst, n);
  const TEventID e = GetTPipePtr()->FetchEventID(HardEvent::V_MTE3);
  SetFlag<HardEvent::V_MTE3>(e);
  WaitFlag<HardEvent::V_MTE3>(e);
  DataCopyPad(g, t, DataCopyExtParams{1, static_cast<uint32_t>(n * sizeof(T)), 0, 0, 0});
}

uint32_t Aligned(uint32_t n) { return (n + 63) / 64 * 64; }

template <class D, class S>
void CastProbe(GM_ADDR x, GM_ADDR out, GM_ADDR params) {
  const ProbeParams p = Params(params);
  TPipe pipe;
  TBuf<TPosition::VECCALC> in, res;
  LocalTensor<S> s = Load<S>(pipe, in, x, p.n, Aligned(p.n));
  pipe.InitBuffer(res, Aligned(p.n) * sizeof(D));
  LocalTensor<D> d = res.Get<D>();
  Cast(d, s, static_cast<RoundMode>(p.arg0), p.n);
  Store(out, d, p.n);
}

}  // namespace

// out = Cast(x) with round mode params.arg0.
extern "C" __global__ __aicore__ void cast_f32_f16(GM_ADDR x, GM_ADDR out, GM_ADDR params) { CastProbe<half, float>(x, out, params); }
extern "C" __global__ __aicore__ void cast_f32_bf16(GM_ADDR x, GM_ADDR out, GM_ADDR params) { CastProbe<bfloat16_t, float>(x, out, params); }
extern "C" __global__ __aicore__ void cast_f32_i32(GM_ADDR x, GM_ADDR out, GM_ADDR params) { CastProbe<int32_t, float>(x, out, params); }
extern "C" __global__ __aicore__ void cast_f16_i32(GM_ADDR x, GM_ADDR out, GM_ADDR params) { CastProbe<int32_t, half>(x, out, params); }
extern "C" __global__ __aicore__ void cast_i32_f32(GM_ADDR x, GM_ADDR out, GM_ADDR params) { CastProbe<float, int32_t>(x, out, params); }
extern "C" __global__ __aicore__ void cast_f16_f32(GM_ADDR x, GM_ADDR out, GM_ADDR params) { CastProbe<float, half>(x, out, params); }

// out = Muls(x, value) on half: float product rounded to half per element.
extern "C" __global__ __aicore__ void muls_f16(GM_ADDR x, GM_ADDR out, GM_ADDR params) {
  const ProbeParams p = Params(params);
  TPipe pipe;
  TBuf<TPosition::VECCALC> xb;
  LocalTensor<half> a = Load<half>(pipe, xb, x, p.n, Aligned(p.n));
  Muls(a, a, p.value, p.n);
  Store(out, a, p.n);
}

// out = where(x <cmp> y, x, y) via Compare + Select(VSEL_TENSOR_TENSOR_MODE), and
// out2 = where(x <cmp> value, x, 2 * value) via CompareScalar + Select(VSEL_TENSOR_SCALAR_MODE).
// n must cover whole 256-byte repeats (Compare's rule).
extern "C" __global__ __aicore__ void compare_select(GM_ADDR x, GM_ADDR y, GM_ADDR out, GM_ADDR out2, GM_ADDR params) {
  const ProbeParams p = Params(params);
  TPipe pipe;
  TBuf<TPosition::VECCALC> xb, yb, maskb, ob;
  LocalTensor<float> a = Load<float>(pipe, xb, x, p.n, p.n);
  LocalTensor<float> b = Load<float>(pipe, yb, y, p.n, p.n);
  pipe.InitBuffer(maskb, p.n / 8);
  pipe.InitBuffer(ob, p.n * sizeof(float));
  LocalTensor<uint8_t> mask = maskb.Get<uint8_t>();
  LocalTensor<float> o = ob.Get<float>();
  const CMPMODE mode = static_cast<CMPMODE>(p.arg0);
  Compare(mask, a, b, mode, p.n);
  PipeBarrier<PIPE_V>();
  Select(o, mask, a, b, SELMODE::VSEL_TENSOR_TENSOR_MODE, p.n);
  Store(out, o, p.n);
  PipeBarrier<PIPE_V>();
  CompareScalar(mask, a, p.value, mode, p.n);
  PipeBarrier<PIPE_V>();
  Select(o, mask, a, 2.0f * p.value, SELMODE::VSEL_TENSOR_SCALAR_MODE, p.n);
  Store(out2, o, p.n);
}

// out = Select(VSEL_CMPMASK_SPR) of x (bit 1) and y (bit 0) with the mask bytes given in m.
extern "C" __global__ __aicore__ void select_mode0(GM_ADDR x, GM_ADDR y, GM_ADDR m, GM_ADDR out, GM_ADDR params) {
  const ProbeParams p = Params(params);
  TPipe pipe;
  TBuf<TPosition::VECCALC> xb, yb, mb, ob;
  LocalTensor<float> a = Load<float>(pipe, xb, x, p.n, p.n);
  LocalTensor<float> b = Load<float>(pipe, yb, y, p.n, p.n);
  LocalTensor<uint8_t> mask = Load<uint8_t>(pipe, mb, m, 32, 32);
  pipe.InitBuffer(ob, p.n * sizeof(float));
  LocalTensor<float> o = ob.Get<float>();
  Select(o, mask, a, b, SELMODE::VSEL_CMPMASK_SPR, p.n);
  Store(out, o, p.n);
}

// out = [sum, 0, max, bits of argmax, min, bits of argmin] of x[0:n] (float). A value+index result
// needs an 8-byte aligned dst for float (ReduceRepeat's dst alignment table).
extern "C" __global__ __aicore__ void reductions(GM_ADDR x, GM_ADDR out, GM_ADDR params) {
  const ProbeParams p = Params(params);
  TPipe pipe;
  TBuf<TPosition::VECCALC> xb, work, res;
  LocalTensor<float> a = Load<float>(pipe, xb, x, p.n, Aligned(p.n));
  pipe.InitBuffer(work, 4096 * sizeof(float));
  pipe.InitBuffer(res, 8 * sizeof(float));
  LocalTensor<float> w = work.Get<float>();
  LocalTensor<float> r = res.Get<float>();
  Duplicate(r, 0.0f, 8);
  PipeBarrier<PIPE_V>();
  ReduceSum(r, a, w, p.n);
  PipeBarrier<PIPE_V>();
  ReduceMax(r[2], a, w, p.n, true);
  PipeBarrier<PIPE_V>();
  ReduceMin(r[4], a, w, p.n, true);
  Store(out, r, 6);
}

// out[0] = ReduceSum of the half values in x[0:n] (saturating half additions).
extern "C" __global__ __aicore__ void reduce_sum_half(GM_ADDR x, GM_ADDR out, GM_ADDR params) {
  const ProbeParams p = Params(params);
  TPipe pipe;
  TBuf<TPosition::VECCALC> xb, work, res;
  LocalTensor<half> a = Load<half>(pipe, xb, x, p.n, Aligned(p.n));
  pipe.InitBuffer(work, 1024 * sizeof(half));
  pipe.InitBuffer(res, 16 * sizeof(half));
  LocalTensor<half> r = res.Get<half>();
  ReduceSum(r, a, work.Get<half>(), p.n);
  Store(out, r, 1);
}

// Rows of 64 floats: sums[r] = WholeReduceSum, maxes[2r], maxes[2r+1] = WholeReduceMax value and
// index bits (ORDER_VALUE_INDEX); params.arg0 rows, params.arg1 active lanes (mask).
extern "C" __global__ __aicore__ void whole_reduce(GM_ADDR x, GM_ADDR sums, GM_ADDR maxes, GM_ADDR params) {
  const ProbeParams p = Params(params);
  const uint32_t rows = p.arg0;
  TPipe pipe;
  TBuf<TPosition::VECCALC> xb, sb, mb;
  LocalTensor<float> a = Load<float>(pipe, xb, x, rows * 64, rows * 64);
  pipe.InitBuffer(sb, Aligned(rows) * sizeof(float));
  pipe.InitBuffer(mb, Aligned(2 * rows) * sizeof(float));
  LocalTensor<float> s = sb.Get<float>();
  LocalTensor<float> m = mb.Get<float>();
  WholeReduceSum(s, a, p.arg1, rows, 1, 1, 8);
  PipeBarrier<PIPE_V>();
  WholeReduceMax(m, a, p.arg1, rows, 1, 1, 8);
  Store(sums, s, rows);
  Store(maxes, m, 2 * rows);
}

// Copies x[0:n] (float) into UB with DataCopyPad(leftPadding=arg0, rightPadding=arg1) and writes
// the whole 32-byte-aligned padded block back with DataCopy, exposing the padding layout.
// arg2: 0 = isPad false, 1 = isPad true with `value`, 2 = isPad false after SetPadValue(value + 1).
extern "C" __global__ __aicore__ void pad_layout(GM_ADDR x, GM_ADDR out, GM_ADDR params) {
  const ProbeParams p = Params(params);
  TPipe pipe;
  TBuf<TPosition::VECCALC> buf;
  pipe.InitBuffer(buf, 256 * sizeof(float));
  LocalTensor<float> t = buf.Get<float>();
  Duplicate(t, -7.0f, 256);
  GlobalTensor<float> g;
  g.SetGlobalBuffer((__gm__ float*)x, p.n);
  if (p.arg2 == 2) SetPadValue(p.value + 1.0f);
  DataCopyPad(t, g, DataCopyExtParams{1, static_cast<uint32_t>(p.n * sizeof(float)), 0, 0, 0},
              DataCopyPadExtParams<float>{p.arg2 == 1, static_cast<uint8_t>(p.arg0), static_cast<uint8_t>(p.arg1), p.value});
  const uint32_t padded = (p.arg0 + p.n + p.arg1 + 7) / 8 * 8;
  PipeBarrier<PIPE_ALL>();  // the Duplicate (V) and the copy in (MTE2) complete before the copy out
  GlobalTensor<float> o;
  o.SetGlobalBuffer((__gm__ float*)out, 256);
  DataCopy(o, t, padded);
}

// Cross-core sum through atomic accumulation in GM: block b adds ReduceSum(x[b*n : (b+1)*n]) into
// out[0] (zeroed by the host) with SetAtomicAdd<float> + DataCopyPad, then SetAtomicNone.
extern "C" __global__ __aicore__ void atomic_sum(GM_ADDR x, GM_ADDR out, GM_ADDR params) {
  const ProbeParams p = Params(params);
  TPipe pipe;
  TBuf<TPosition::VECCALC> xb, work, res;
  LocalTensor<float> a = Load<float>(pipe, xb, x + GetBlockIdx() * p.n * sizeof(float), p.n, Aligned(p.n));
  pipe.InitBuffer(work, 64 * sizeof(float));
  pipe.InitBuffer(res, 8 * sizeof(float));
  LocalTensor<float> r = res.Get<float>();
  ReduceSum(r, a, work.Get<float>(), p.n);
  SetAtomicAdd<float>();
  Store(out, r, 1);
  if (p.arg0 == 0) SetAtomicNone();  // arg0 = 1: forget it (a violation at kernel end)
}
