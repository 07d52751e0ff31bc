// Row softmax of x[rows, cols] (float32) with every row split across all blocks: block b owns
// columns [b * chunk, (b + 1) * chunk). The blocks exchange per-row partial maxima and partial
// sums through a GM workspace, separated by SyncAll():
//   phase 1: ReduceMax of the block's segment -> workspace max[row][b]
//   phase 2: global max = ReduceMax of max[row][:]; ReduceSum(exp(x - max)) -> workspace sum[row][b]
//   phase 3: global sum = ReduceSum of sum[row][:]; out = exp(x - max) / sum
// Segments and the partial vectors are copied with DataCopyPad (any length).
#include "kernel_operator.h"

using namespace AscendC;

struct SoftmaxTiling {
  uint32_t rows;
  uint32_t cols;
  uint32_t chunk;  // columns per block, a multiple of 8
};

class KernelSoftmax {
 public:
  __aicore__ inline void Init(GM_ADDR x, GM_ADDR out, GM_ADDR workspace, const SoftmaxTiling& t, TPipe* pipe) {
    rows_ = t.rows;
    cols_ = t.cols;
    blocks_ = GetBlockNum();
    block_ = GetBlockIdx();
    const uint32_t start = t.chunk * block_;
    n_ = start >= cols_ ? 0 : (cols_ - start < t.chunk ? cols_ - start : t.chunk);
    start_ = start;
    xGm_.SetGlobalBuffer((__gm__ float*)x, rows_ * cols_);
    outGm_.SetGlobalBuffer((__gm__ float*)out, rows_ * cols_);
    // Kernel direct invocation without HAVE_WORKSPACE: the argument is the user workspace itself
    // (GetUserWorkspace would skip a system workspace nobody set).
    maxGm_.SetGlobalBuffer((__gm__ float*)workspace, rows_ * blocks_);
    sumGm_.SetGlobalBuffer((__gm__ float*)workspace + rows_ * blocks_, rows_ * blocks_);
    pipe->InitBuffer(inQueue_, 1, t.chunk * sizeof(float));
    pipe->InitBuffer(outQueue_, 1, t.chunk * sizeof(float));
    pipe->InitBuffer(partQueue_, 1, blocks_ * sizeof(float));
    // ReduceMax without index needs ceil(2 * repeats / 8) * 8 floats of work space (64 floats per
    // repeat); ReduceSum needs less.
    const uint32_t repeats = (t.chunk + 63) / 64;
    pipe->InitBuffer(workBuf_, ((2 * repeats + 7) / 8 * 8) * sizeof(float));
    pipe->InitBuffer(scalarBuf_, 8 * sizeof(float));
  }

  __aicore__ inline void Process() {
    for (uint32_t r = 0; r < rows_; ++r) {
      float m = -INFINITY;
      if (n_ > 0) {
        LocalTensor<float> x = LoadSegment(r);
        m = Reduce(x, n_, true);
        inQueue_.FreeTensor(x);
      }
      StorePartial(maxGm_, r, m);
    }
    SyncAll();
    for (uint32_t r = 0; r < rows_; ++r) {
      const float gmax = Combine(maxGm_, r, true);
      float s = 0.0f;
      if (n_ > 0) {
        LocalTensor<float> x = LoadSegment(r);
        Adds(x, x, -gmax, n_);
        PipeBarrier<PIPE_V>();
        Exp(x, x, n_);
        PipeBarrier<PIPE_V>();
        s = Reduce(x, n_, false);
        inQueue_.FreeTensor(x);
      }
      StorePartial(sumGm_, r, s);
    }
    SyncAll();
    for (uint32_t r = 0; r < rows_; ++r) {
      const float gmax = Combine(maxGm_, r, true);
      const float total = Combine(sumGm_, r, false);
      if (n_ == 0) continue;
      LocalTensor<float> x = LoadSegment(r);
      LocalTensor<float> y = outQueue_.AllocTensor<float>();
      Adds(y, x, -gmax, n_);
      PipeBarrier<PIPE_V>();
      Exp(y, y, n_);
      PipeBarrier<PIPE_V>();
      Muls(y, y, 1.0f / total, n_);
      inQueue_.FreeTensor(x);
      outQueue_.EnQue(y);
      y = outQueue_.DeQue<float>();
      DataCopyPad(outGm_[r * cols_ + start_], y, DataCopyExtParams{1, n_ * 4, 0, 0, 0});
      outQueue_.FreeTensor(y);
    }
  }

 private:
  __aicore__ inline LocalTensor<float> LoadSegment(uint32_t r) {
    LocalTensor<float> x = inQueue_.AllocTensor<float>();
    DataCopyPad(x, xGm_[r * cols_ + start_], DataCopyExtParams{1, n_ * 4, 0, 0, 0},
                DataCopyPadExtParams<float>{false, 0, 0, 0});
    inQueue_.EnQue(x);
    return inQueue_.DeQue<float>();
  }

  // ReduceMax / ReduceSum of n elements, read back as a scalar.
  __aicore__ inline float Reduce(const LocalTensor<float>& x, uint32_t n, bool max) {
    LocalTensor<float> work = workBuf_.Get<float>();
    LocalTensor<float> out = scalarBuf_.Get<float>();
    if (max) {
      ReduceMax(out, x, work, n);
    } else {
      ReduceSum(out, x, work, n);
    }
    SetFlag<HardEvent::V_S>(EVENT_ID0);
    WaitFlag<HardEvent::V_S>(EVENT_ID0);
    return out.GetValue(0);
  }

  __aicore__ inline void StorePartial(GlobalTensor<float>& gm, uint32_t r, float v) {
    LocalTensor<float> t = outQueue_.AllocTensor<float>();
    Duplicate(t, v, 8);
    outQueue_.EnQue(t);
    t = outQueue_.DeQue<float>();
    DataCopyPad(gm[r * blocks_ + block_], t, DataCopyExtParams{1, 4, 0, 0, 0});
    outQueue_.FreeTensor(t);
  }

  // Max or sum over the per-block partials of row r.
  __aicore__ inline float Combine(GlobalTensor<float>& gm, uint32_t r, bool max) {
    LocalTensor<float> p = partQueue_.AllocTensor<float>();
    DataCopyPad(p, gm[r * blocks_], DataCopyExtParams{1, blocks_ * 4, 0, 0, 0},
                DataCopyPadExtParams<float>{false, 0, 0, 0});
    partQueue_.EnQue(p);
    p = partQueue_.DeQue<float>();
    const float v = Reduce(p, blocks_, max);
    partQueue_.FreeTensor(p);
    return v;
  }

  TQue<QuePosition::VECIN, 1> inQueue_, partQueue_;
  TQue<QuePosition::VECOUT, 1> outQueue_;
  TBuf<TPosition::VECCALC> workBuf_, scalarBuf_;
  GlobalTensor<float> xGm_, outGm_, maxGm_, sumGm_;
  uint32_t rows_ = 0, cols_ = 0, blocks_ = 0, block_ = 0, start_ = 0, n_ = 0;
};

extern "C" __global__ __aicore__ void softmax_cross_core(GM_ADDR x, GM_ADDR out, GM_ADDR workspace,
                                                          GM_ADDR tiling) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIV_1_0);  // SyncAll: a MIX kernel (AIV only, 1:0)
  const SoftmaxTiling t = *reinterpret_cast<__gm__ SoftmaxTiling*>(tiling);
  TPipe pipe;
  KernelSoftmax op;
  op.Init(x, out, workspace, t, &pipe);
  op.Process();
}
