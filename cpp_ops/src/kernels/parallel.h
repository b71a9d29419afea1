// Work splitting for the kernels, with no ONNX Runtime types in it.
//
// A kernel cuts its work into `num_tasks` independent tasks and asks a Parallel to run
// task(i) for every i in [0, num_tasks). How the tasks are spread over threads must never
// change a result: kernels choose task boundaries from the problem shape alone (never from
// the thread count), so outputs are bit-identical for any number of threads.
//
// Every task runs with TensorFlow's denormal mode (flush-to-zero and denormals-are-zero, see
// simd.h): TF's executor and its thread pools hold that mode for every CPU kernel, the MXCSR state
// is per thread, and ONNX Runtime's pool threads do not set it. The serial path runs on the thread
// of the kernel's Compute, which op_base.h puts in that mode for the kernel's duration.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/simd.h"

namespace tfops {

class Parallel {
 public:
  // Runs fn(arg, i) for i in [0, num_tasks); returns when all have finished.
  using TaskFn = void (*)(void* arg, std::size_t i);
  using Runner = void (*)(void* pool, TaskFn fn, void* arg, std::size_t num_tasks);

  Parallel() = default;  // serial
  Parallel(Runner runner, void* pool) : runner_(runner), pool_(pool) {}

  template <typename F>
  void For(std::size_t num_tasks, F&& task) const {
    if (num_tasks == 0) return;
    if (runner_ == nullptr || num_tasks == 1) {
      for (std::size_t i = 0; i < num_tasks; ++i) task(i);
      return;
    }
    auto trampoline = [](void* arg, std::size_t i) {
      ScopedFlushDenormals flush;
      (*static_cast<F*>(arg))(i);
    };
    runner_(pool_, trampoline, &task, num_tasks);
  }

  // Splits [0, n) into contiguous blocks of at least `grain` items (a shape-only choice) and
  // runs block(begin, end) for each.
  template <typename F>
  void ForRange(std::int64_t n, std::int64_t grain, F&& block) const {
    if (n <= 0) return;
    grain = std::max<std::int64_t>(grain, 1);
    const std::int64_t tasks = (n + grain - 1) / grain;
    For(static_cast<std::size_t>(tasks), [&](std::size_t t) {
      const std::int64_t begin = static_cast<std::int64_t>(t) * grain;
      block(begin, std::min(n, begin + grain));
    });
  }

 private:
  Runner runner_ = nullptr;
  void* pool_ = nullptr;
};

}  // namespace tfops
