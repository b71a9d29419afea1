// Host emulation of the CUDA batch-norm kernels (tests/test_cuda_emulation_batch_norm.py).
//
// batch_norm_cuda_emu.inc is kernels/cuda/batch_norm.cu with its launches rewritten for
// cuda_host_emu.h (the test does that rewrite): the launchers, plans and __global__ kernels run
// unchanged, thread by thread over the same grids and barrier phases. "Device" pointers are host
// pointers here; scratch is host memory filled with NaN bytes, so a partial sum or coefficient that
// no thread writes shows up as NaN in the outputs.
#include "cuda_host_emu.h"
// (cuda_host_emu.h must come first: it defines the CUDA keywords the kernels use.)
#include "batch_norm_cuda_emu.inc"

#include <cstdio>
#include <cstdlib>
#include <exception>

namespace {

class HostScratch : public tfops::DeviceScratch {
 public:
  ~HostScratch() override {
    for (void* block : blocks_) std::free(block);
  }
  void* Allocate(std::size_t bytes) override {
    const std::size_t rounded = (bytes + 255) / 256 * 256 + 256;
    void* block = std::aligned_alloc(256, rounded);
    if (block == nullptr) throw std::bad_alloc();
    std::memset(block, 0xff, rounded);  // NaN floats
    blocks_.push_back(block);
    return block;
  }

 private:
  std::vector<void*> blocks_;
};

tfops::batch_norm::Layout LayoutOf(long long outer, long long channels, long long inner) {
  tfops::batch_norm::Layout l;
  l.outer = outer;
  l.channels = channels;
  l.inner = inner;
  return l;
}

template <typename F>
int Guard(char* error, int error_len, const F& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    std::snprintf(error, static_cast<std::size_t>(error_len), "%s", e.what());
    return 1;
  }
}

}  // namespace

// dtype: 0 float32, 1 float16, 2 bfloat16. Returns 0, or 1 with a message in `error`.
extern "C" int bn_emu_forward(int dtype, long long outer, long long channels, long long inner, const void* x,
                              const float* scale, const float* offset, const float* mean, const float* variance,
                              float epsilon, float factor, int is_training, void* y, float* batch_mean,
                              float* batch_variance, float* reserve_1, float* reserve_2, float* reserve_3,
                              long long* launches, char* error, int error_len) {
  return Guard(error, error_len, [&] {
    const auto l = LayoutOf(outer, channels, inner);
    HostScratch scratch;
    const tfops::CudaLaunch launch{nullptr, &scratch};
    const long before = emu::g_state.launches;
    auto run = [&](auto tag) {
      using T = decltype(tag);
      tfops::cuda::BatchNormForward<T>(l, static_cast<const T*>(x), scale, offset, mean, variance, epsilon, factor,
                                       is_training != 0, static_cast<T*>(y), batch_mean, batch_variance, reserve_1,
                                       reserve_2, reserve_3, launch);
    };
    if (dtype == 0) run(float{});
    else if (dtype == 1) run(tfops::Half{});
    else run(tfops::BFloat16{});
    *launches = emu::g_state.launches - before;
  });
}

extern "C" int bn_emu_grad(int dtype, long long outer, long long channels, long long inner, const void* dy,
                           const void* x, const float* scale, const float* reserve_1, const float* reserve_2,
                           float epsilon, int is_training, void* dx, float* scale_backprop, float* offset_backprop,
                           long long* launches, char* error, int error_len) {
  return Guard(error, error_len, [&] {
    const auto l = LayoutOf(outer, channels, inner);
    HostScratch scratch;
    const tfops::CudaLaunch launch{nullptr, &scratch};
    const long before = emu::g_state.launches;
    auto run = [&](auto tag) {
      using T = decltype(tag);
      tfops::cuda::BatchNormGrad<T>(l, static_cast<const T*>(dy), static_cast<const T*>(x), scale, reserve_1,
                                    reserve_2, epsilon, is_training != 0, static_cast<T*>(dx), scale_backprop,
                                    offset_backprop, launch);
    };
    if (dtype == 0) run(float{});
    else if (dtype == 1) run(tfops::Half{});
    else run(tfops::BFloat16{});
    *launches = emu::g_state.launches - before;
  });
}
