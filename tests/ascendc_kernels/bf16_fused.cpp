// bfloat16 fused kernel: out = bf16(relu(x - y) * x) computed in float. The Vector unit of Atlas
// A2/A3 has no bfloat16 arithmetic, so the inputs are Cast to float (exact), the body runs in
// float and one Cast (round mode from the tiling) produces the bfloat16 result.
#include "kernel_operator.h"

using namespace AscendC;

struct Bf16Tiling {
  uint32_t totalLength;
  uint32_t blockLength;
  uint32_t tileLength;  // a multiple of 16
  uint32_t roundMode;   // AscendC::RoundMode of the final Cast
};

extern "C" __global__ __aicore__ void bf16_fused(GM_ADDR x, GM_ADDR y, GM_ADDR out, GM_ADDR tiling) {
  const Bf16Tiling t = *reinterpret_cast<__gm__ Bf16Tiling*>(tiling);
  const uint32_t start = t.blockLength * GetBlockIdx();
  uint32_t length = start >= t.totalLength ? 0 : t.totalLength - start;
  if (length > t.blockLength) length = t.blockLength;
  GlobalTensor<bfloat16_t> xGm, yGm, outGm;
  xGm.SetGlobalBuffer((__gm__ bfloat16_t*)x + start, length);
  yGm.SetGlobalBuffer((__gm__ bfloat16_t*)y + start, length);
  outGm.SetGlobalBuffer((__gm__ bfloat16_t*)out + start, length);

  TPipe pipe;
  TQue<QuePosition::VECIN, 2> inQ;  // depth 2: x and y are EnQue'd back to back
  TQue<QuePosition::VECOUT, 1> outQ;
  TBuf<TPosition::VECCALC> xf, yf;
  pipe.InitBuffer(inQ, 2, t.tileLength * sizeof(bfloat16_t));
  pipe.InitBuffer(outQ, 1, t.tileLength * sizeof(bfloat16_t));
  pipe.InitBuffer(xf, t.tileLength * sizeof(float));
  pipe.InitBuffer(yf, t.tileLength * sizeof(float));
  LocalTensor<float> a = xf.Get<float>();
  LocalTensor<float> b = yf.Get<float>();

  for (uint32_t off = 0; off < length; off += t.tileLength) {
    const uint32_t n = length - off < t.tileLength ? length - off : t.tileLength;
    DataCopyExtParams copy{1, static_cast<uint32_t>(n * sizeof(bfloat16_t)), 0, 0, 0};
    LocalTensor<bfloat16_t> xb = inQ.AllocTensor<bfloat16_t>();
    LocalTensor<bfloat16_t> yb = inQ.AllocTensor<bfloat16_t>();
    DataCopyPad(xb, xGm[off], copy, DataCopyPadExtParams<bfloat16_t>{false, 0, 0, 0});
    DataCopyPad(yb, yGm[off], copy, DataCopyPadExtParams<bfloat16_t>{false, 0, 0, 0});
    inQ.EnQue(xb);
    inQ.EnQue(yb);
    xb = inQ.DeQue<bfloat16_t>();
    yb = inQ.DeQue<bfloat16_t>();
    Cast(a, xb, RoundMode::CAST_NONE, n);
    PipeBarrier<PIPE_V>();
    Cast(b, yb, RoundMode::CAST_NONE, n);
    inQ.FreeTensor(xb);
    inQ.FreeTensor(yb);
    PipeBarrier<PIPE_V>();
    Sub(b, a, b, n);
    PipeBarrier<PIPE_V>();
    Relu(b, b, n);
    PipeBarrier<PIPE_V>();
    Mul(b, b, a, n);
    LocalTensor<bfloat16_t> ob = outQ.AllocTensor<bfloat16_t>();
    PipeBarrier<PIPE_V>();
    Cast(ob, b, static_cast<RoundMode>(t.roundMode), n);
    outQ.EnQue(ob);
    ob = outQ.DeQue<bfloat16_t>();
    DataCopyPad(outGm[off], ob, copy);
    outQ.FreeTensor(ob);
  }
}
