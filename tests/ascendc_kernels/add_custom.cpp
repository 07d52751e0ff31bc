// Element-wise z = x + y (float32) in the documented AscendC style: one block per slice of the
// input, double-buffered CopyIn -> Compute -> CopyOut over tiles, the last tile of a slice copied
// with DataCopyPad. The shape comes from a small tiling struct in GM.
#include "kernel_operator.h"

constexpr int32_t BUFFER_NUM = 2;

struct AddTiling {
  uint32_t totalLength;  // elements of x, y and z
  uint32_t blockLength;  // elements per block (the last block may get fewer)
  uint32_t tileLength;   // elements per tile, a multiple of 8 (32 bytes)
};

class KernelAdd {
 public:
  __aicore__ inline KernelAdd() {}
  __aicore__ inline void Init(GM_ADDR x, GM_ADDR y, GM_ADDR z, const AddTiling& tiling, AscendC::TPipe* pipe) {
    const uint32_t start = tiling.blockLength * AscendC::GetBlockIdx();
    length_ = start >= tiling.totalLength ? 0 : tiling.totalLength - start;
    if (length_ > tiling.blockLength) length_ = tiling.blockLength;
    tileLength_ = tiling.tileLength;
    xGm_.SetGlobalBuffer((__gm__ float*)x + start, length_);
    yGm_.SetGlobalBuffer((__gm__ float*)y + start, length_);
    zGm_.SetGlobalBuffer((__gm__ float*)z + start, length_);
    pipe->InitBuffer(inQueueX_, BUFFER_NUM, tileLength_ * sizeof(float));
    pipe->InitBuffer(inQueueY_, BUFFER_NUM, tileLength_ * sizeof(float));
    pipe->InitBuffer(outQueueZ_, BUFFER_NUM, tileLength_ * sizeof(float));
  }
  __aicore__ inline void Process() {
    const uint32_t tiles = (length_ + tileLength_ - 1) / tileLength_;
    for (uint32_t i = 0; i < tiles; ++i) {
      CopyIn(i);
      Compute(i);
      CopyOut(i);
    }
  }

 private:
  __aicore__ inline uint32_t Count(uint32_t i) const {
    const uint32_t left = length_ - i * tileLength_;
    return left < tileLength_ ? left : tileLength_;
  }
  __aicore__ inline void CopyIn(uint32_t i) {
    AscendC::LocalTensor<float> xLocal = inQueueX_.AllocTensor<float>();
    AscendC::LocalTensor<float> yLocal = inQueueY_.AllocTensor<float>();
    const uint32_t n = Count(i);
    if (n == tileLength_) {
      AscendC::DataCopy(xLocal, xGm_[i * tileLength_], n);
      AscendC::DataCopy(yLocal, yGm_[i * tileLength_], n);
    } else {  // tail: not a whole number of 32-byte blocks
      AscendC::DataCopyExtParams copy{1, static_cast<uint32_t>(n * sizeof(float)), 0, 0, 0};
      AscendC::DataCopyPadExtParams<float> pad{false, 0, 0, 0};
      AscendC::DataCopyPad(xLocal, xGm_[i * tileLength_], copy, pad);
      AscendC::DataCopyPad(yLocal, yGm_[i * tileLength_], copy, pad);
    }
    inQueueX_.EnQue(xLocal);
    inQueueY_.EnQue(yLocal);
  }
  __aicore__ inline void Compute(uint32_t i) {
    AscendC::LocalTensor<float> xLocal = inQueueX_.DeQue<float>();
    AscendC::LocalTensor<float> yLocal = inQueueY_.DeQue<float>();
    AscendC::LocalTensor<float> zLocal = outQueueZ_.AllocTensor<float>();
    AscendC::Add(zLocal, xLocal, yLocal, Count(i));
    outQueueZ_.EnQue<float>(zLocal);
    inQueueX_.FreeTensor(xLocal);
    inQueueY_.FreeTensor(yLocal);
  }
  __aicore__ inline void CopyOut(uint32_t i) {
    AscendC::LocalTensor<float> zLocal = outQueueZ_.DeQue<float>();
    const uint32_t n = Count(i);
    if (n == tileLength_) {
      AscendC::DataCopy(zGm_[i * tileLength_], zLocal, n);
    } else {
      AscendC::DataCopyExtParams copy{1, static_cast<uint32_t>(n * sizeof(float)), 0, 0, 0};
      AscendC::DataCopyPad(zGm_[i * tileLength_], zLocal, copy);
    }
    outQueueZ_.FreeTensor(zLocal);
  }

  AscendC::TQue<AscendC::QuePosition::VECIN, BUFFER_NUM> inQueueX_, inQueueY_;
  AscendC::TQue<AscendC::QuePosition::VECOUT, BUFFER_NUM> outQueueZ_;
  AscendC::GlobalTensor<float> xGm_, yGm_, zGm_;
  uint32_t length_ = 0;
  uint32_t tileLength_ = 0;
};

extern "C" __global__ __aicore__ void add_custom(GM_ADDR x, GM_ADDR y, GM_ADDR z, GM_ADDR tiling) {
  const AddTiling t = *reinterpret_cast<__gm__ AddTiling*>(tiling);
  AscendC::TPipe pipe;
  KernelAdd op;
  op.Init(x, y, z, t, &pipe);
  op.Process();
}
