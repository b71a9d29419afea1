// The CUDA half of gpu_check (a build with CUDA only): runs a Prepared's launcher on device copies of a case's
// inputs, on one non-default stream, and reads the outputs back; captures it in a CUDA graph; times it. Only
// CUDA runtime calls here: the kernels are the library's own (cpp_ops/src/kernels/cuda/*.cu).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "kernels/simd.h"

namespace gpu_check {
namespace {

struct CudaFailure : std::runtime_error {
  explicit CudaFailure(const std::string& what, cudaError_t e) : std::runtime_error(what), error(e) {}
  cudaError_t error;
};

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaFailure(std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e), e);
}

cudaStream_t Stream() {
  static cudaStream_t stream = [] {
    cudaStream_t s = nullptr;
    Check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return s;
  }();
  return stream;
}

// Whether the context still works after an error (an illegal address, say, leaves it unusable).
bool ContextBroken() {
  cudaGetLastError();
  void* p = nullptr;
  if (cudaMalloc(&p, 256) != cudaSuccess) return true;
  const bool bad = cudaMemset(p, 0, 256) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess;
  cudaFree(p);
  return bad;
}

// Device scratch as ORT's allocator serves it to a kernel: in the order of the stream.
class StreamScratch : public tfops::DeviceScratch {
 public:
  explicit StreamScratch(cudaStream_t s) : stream_(s) {}
  ~StreamScratch() override { Release(); }
  void* Allocate(std::size_t bytes) override {
    if (bytes == 0) bytes = 1;
    void* p = nullptr;
    Check(cudaMallocAsync(&p, bytes, stream_), "scratch cudaMallocAsync");
    blocks_.push_back(p);
    return p;
  }
  void Release() {
    for (void* p : blocks_) cudaFreeAsync(p, stream_);
    blocks_.clear();
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> blocks_;
};

// The device buffers of one case: inputs copied in, outputs poisoned, each `offset` bytes past an aligned base.
struct Buffers {
  std::vector<void*> bases;
  Pointers in;
  MutablePointers out;
  std::vector<std::size_t> out_bytes, in_bytes;

  Buffers(const Case& c, const Prepared& p, bool misaligned, unsigned char poison) {
    for (const Tensor& t : c.inputs) {
      void* d = Alloc(t.nbytes(), misaligned ? SizeOf(t.dtype) : 0);
      if (t.nbytes()) Check(cudaMemcpyAsync(d, t.data(), t.nbytes(), cudaMemcpyHostToDevice, Stream()), "input copy");
      in.push_back(d);
      in_bytes.push_back(t.nbytes());
    }
    for (const Tensor& t : p.outputs) {
      void* d = Alloc(t.nbytes(), misaligned ? SizeOf(t.dtype) : 0);
      Check(cudaMemsetAsync(d, poison, t.nbytes(), Stream()), "output poison");
      out.push_back(d);
      out_bytes.push_back(t.nbytes());
    }
  }
  ~Buffers() {
    for (void* b : bases) cudaFreeAsync(b, Stream());
  }
  void* Alloc(std::size_t bytes, std::size_t offset) {
    void* b = nullptr;
    Check(cudaMallocAsync(&b, bytes + 256, Stream()), "cudaMallocAsync");
    bases.push_back(b);
    return static_cast<char*>(b) + offset;
  }
  void Upload(const Case& c, const Prepared& p) {  // the device inputs of c into the same buffers
    for (std::size_t i = 0; i < c.inputs.size(); ++i) {
      if (p.host_input[i] || !c.inputs[i].nbytes()) continue;
      Check(cudaMemcpyAsync(const_cast<void*>(in[i]), c.inputs[i].data(), c.inputs[i].nbytes(), cudaMemcpyHostToDevice,
                            Stream()),
            "input copy");
    }
  }
  void Poison(unsigned char poison) {
    for (std::size_t k = 0; k < out.size(); ++k) Check(cudaMemsetAsync(out[k], poison, out_bytes[k], Stream()), "output poison");
  }
  std::vector<Tensor> Download(const Prepared& p) {
    std::vector<Tensor> outs = p.outputs;
    for (std::size_t k = 0; k < outs.size(); ++k) {
      if (outs[k].nbytes())
        Check(cudaMemcpyAsync(outs[k].data(), out[k], outs[k].nbytes(), cudaMemcpyDeviceToHost, Stream()), "output copy");
    }
    Check(cudaStreamSynchronize(Stream()), "cudaStreamSynchronize after the output copies");
    return outs;
  }
};

// Runs the launcher with the host thread in TF's denormal mode (the adapter's Compute is).
void Launch(const Prepared& p, Buffers& b, StreamScratch& scratch) {
  tfops::ScopedFlushDenormals flush;
  tfops::CudaLaunch launch;
  launch.stream = Stream();
  launch.scratch = &scratch;
  p.gpu(b.in, b.out, launch);
  scratch.Release();
}

std::string Describe(const std::exception& e) { return e.what(); }

double Median(std::vector<float> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Evicts the L2 cache between timed runs (a write larger than any current L2), outside the timed region.
void FlushL2() {
  static void* big = nullptr;
  constexpr std::size_t kBytes = std::size_t{256} << 20;
  if (!big) Check(cudaMalloc(&big, kBytes), "L2 flush buffer");
  Check(cudaMemsetAsync(big, 0x5a, kBytes, Stream()), "L2 flush");
}

}  // namespace

DeviceInfo ProbeDevice() {
  DeviceInfo info;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    info.why = e != cudaSuccess ? std::string("no usable CUDA device: ") + cudaGetErrorString(e) : "no CUDA device";
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    info.why = "cannot read the device's properties";
    return info;
  }
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  info.ok = true;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  info.memory_gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  info.driver = std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10);
  info.runtime = std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10);
  return info;
}

DeviceRun RunOnDevice(const Case& c, const Prepared& p, int variant) {
  DeviceRun r;
  try {
    StreamScratch scratch(Stream());
    Buffers b(c, p, variant == 2, variant == 1 ? 0xA5 : 0xFF);
    Launch(p, b, scratch);
    Check(cudaGetLastError(), "launch");
    Check(cudaStreamSynchronize(Stream()), "cudaStreamSynchronize after the launches");
    r.outputs = b.Download(p);
  } catch (const std::exception& e) {
    r.error = Describe(e);
    r.broken = ContextBroken();
  }
  return r;
}

GraphRun GraphOnDevice(const Case& a, const Prepared& p, const std::vector<const Case*>& replays) {
  GraphRun r;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  try {
    StreamScratch scratch(Stream());
    Buffers b(a, p, false, 0xFF);
    Check(cudaStreamSynchronize(Stream()), "cudaStreamSynchronize before the capture");
    Check(cudaStreamBeginCapture(Stream(), cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    try {
      Launch(p, b, scratch);
    } catch (...) {
      cudaGraph_t dropped = nullptr;
      cudaStreamEndCapture(Stream(), &dropped);
      if (dropped) cudaGraphDestroy(dropped);
      throw;
    }
    Check(cudaStreamEndCapture(Stream(), &graph), "cudaStreamEndCapture (the launcher broke the capture)");
    Check(cudaGraphGetNodes(graph, nullptr, &r.nodes), "cudaGraphGetNodes");
    Check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    unsigned char poison = 0xFF;
    for (const Case* c : replays) {
      b.Upload(*c, p);
      b.Poison(poison);
      poison = poison == 0xFF ? 0xA5 : 0xFF;
      Check(cudaGraphLaunch(exec, Stream()), "cudaGraphLaunch");
      Check(cudaStreamSynchronize(Stream()), "cudaStreamSynchronize after a replay");
      r.outputs.push_back(b.Download(p));
    }
  } catch (const std::exception& e) {
    r.error = Describe(e);
    r.broken = ContextBroken();
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  return r;
}

Timing TimeOnDevice(const Case& c, const Prepared& p, int repeat) {
  Timing t;
  for (const Tensor& x : c.inputs)
    if (IsFloat(x.dtype)) t.bytes += static_cast<int64_t>(x.nbytes());
  for (const Tensor& y : p.outputs) t.bytes += static_cast<int64_t>(y.nbytes());
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  void *src = nullptr, *dst = nullptr;
  try {
    Check(cudaEventCreate(&start), "cudaEventCreate");
    Check(cudaEventCreate(&stop), "cudaEventCreate");
    StreamScratch scratch(Stream());
    Buffers b(c, p, false, 0xFF);
    auto timed = [&](auto&& body) {
      std::vector<float> ms;
      for (int i = 0; i < 3 + repeat; ++i) {
        FlushL2();
        Check(cudaEventRecord(start, Stream()), "cudaEventRecord");
        body();
        Check(cudaEventRecord(stop, Stream()), "cudaEventRecord");
        Check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float elapsed = 0;
        Check(cudaEventElapsedTime(&elapsed, start, stop), "cudaEventElapsedTime");
        if (i >= 3) ms.push_back(elapsed);  // three warm-up runs
      }
      return Median(ms) * 1000.0;
    };
    t.launch_us = timed([&] { Launch(p, b, scratch); });
    Check(cudaStreamBeginCapture(Stream(), cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
    Launch(p, b, scratch);
    Check(cudaStreamEndCapture(Stream(), &graph), "cudaStreamEndCapture");
    Check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    t.kernel_us = timed([&] { Check(cudaGraphLaunch(exec, Stream()), "cudaGraphLaunch"); });
    const std::size_t half = std::max<std::size_t>(static_cast<std::size_t>(t.bytes / 2), 1);
    Check(cudaMalloc(&src, half), "cudaMalloc");
    Check(cudaMalloc(&dst, half), "cudaMalloc");
    Check(cudaMemset(src, 0x3c, half), "cudaMemset");
    t.copy_us = timed([&] { Check(cudaMemcpyAsync(dst, src, half, cudaMemcpyDeviceToDevice, Stream()), "copy"); });
  } catch (const std::exception& e) {
    t.error = Describe(e);
    t.broken = ContextBroken();
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (src) cudaFree(src);
  if (dst) cudaFree(dst);
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  return t;
}

}  // namespace gpu_check
