// float16 fused kernel: out = half(0.5 * exp(float(min(max(x * y + x, -4), 4)))).
// x * y + x and the clamp run natively in half (each instruction rounds to half, as on the Vector
// unit); exp runs in float after a Cast and the result is Cast back with CAST_RINT.
#include "kernel_operator.h"

using namespace AscendC;

constexpr int32_t BUFFER_NUM = 2;

struct EltTiling {
  uint32_t totalLength;
  uint32_t blockLength;
  uint32_t tileLength;  // a multiple of 16 halves (32 bytes)
};

class KernelHalfFused {
 public:
  __aicore__ inline void Init(GM_ADDR x, GM_ADDR y, GM_ADDR out, const EltTiling& t, TPipe* pipe) {
    const uint32_t start = t.blockLength * GetBlockIdx();
    length_ = start >= t.totalLength ? 0 : t.totalLength - start;
    if (length_ > t.blockLength) length_ = t.blockLength;
    tile_ = t.tileLength;
    xGm_.SetGlobalBuffer((__gm__ half*)x + start, length_);
    yGm_.SetGlobalBuffer((__gm__ half*)y + start, length_);
    outGm_.SetGlobalBuffer((__gm__ half*)out + start, length_);
    pipe->InitBuffer(inX_, BUFFER_NUM, tile_ * sizeof(half));
    pipe->InitBuffer(inY_, BUFFER_NUM, tile_ * sizeof(half));
    pipe->InitBuffer(outQ_, BUFFER_NUM, tile_ * sizeof(half));
    pipe->InitBuffer(f32Buf_, tile_ * sizeof(float));
  }
  __aicore__ inline void Process() {
    for (uint32_t off = 0; off < length_; off += tile_) {
      const uint32_t n = length_ - off < tile_ ? length_ - off : tile_;
      CopyIn(off, n);
      Compute(n);
      CopyOut(off, n);
    }
  }

 private:
  __aicore__ inline void CopyIn(uint32_t off, uint32_t n) {
    LocalTensor<half> x = inX_.AllocTensor<half>();
    LocalTensor<half> y = inY_.AllocTensor<half>();
    DataCopyExtParams copy{1, static_cast<uint32_t>(n * sizeof(half)), 0, 0, 0};
    DataCopyPadExtParams<half> pad{false, 0, 0, 0};
    DataCopyPad(x, xGm_[off], copy, pad);
    DataCopyPad(y, yGm_[off], copy, pad);
    inX_.EnQue(x);
    inY_.EnQue(y);
  }
  __aicore__ inline void Compute(uint32_t n) {
    LocalTensor<half> x = inX_.DeQue<half>();
    LocalTensor<half> y = inY_.DeQue<half>();
    LocalTensor<half> o = outQ_.AllocTensor<half>();
    LocalTensor<float> f = f32Buf_.Get<float>();
    Mul(o, x, y, n);
    PipeBarrier<PIPE_V>();
    Add(o, o, x, n);
    PipeBarrier<PIPE_V>();
    Maxs(o, o, static_cast<half>(-4.0f), n);
    PipeBarrier<PIPE_V>();
    Mins(o, o, 4.0f, n);
    PipeBarrier<PIPE_V>();
    Cast(f, o, RoundMode::CAST_NONE, n);
    PipeBarrier<PIPE_V>();
    Exp(f, f, n);
    PipeBarrier<PIPE_V>();
    Muls(f, f, 0.5f, n);
    PipeBarrier<PIPE_V>();
    Cast(o, f, RoundMode::CAST_RINT, n);
    outQ_.EnQue(o);
    inX_.FreeTensor(x);
    inY_.FreeTensor(y);
  }
  __aicore__ inline void CopyOut(uint32_t off, uint32_t n) {
    LocalTensor<half> o = outQ_.DeQue<half>();
    DataCopyPad(outGm_[off], o, DataCopyExtParams{1, static_cast<uint32_t>(n * sizeof(half)), 0, 0, 0});
    outQ_.FreeTensor(o);
  }

  TQue<QuePosition::VECIN, BUFFER_NUM> inX_, inY_;
  TQue<QuePosition::VECOUT, BUFFER_NUM> outQ_;
  TBuf<TPosition::VECCALC> f32Buf_;
  GlobalTensor<half> xGm_, yGm_, outGm_;
  uint32_t length_ = 0, tile_ = 0;
};

extern "C" __global__ __aicore__ void half_fused(GM_ADDR x, GM_ADDR y, GM_ADDR out, GM_ADDR tiling) {
  const EltTiling t = *reinterpret_cast<__gm__ EltTiling*>(tiling);
  TPipe pipe;
  KernelHalfFused op;
  op.Init(x, y, out, t, &pipe);
  op.Process();
}
