// gpu_check: the library's CUDA launchers against its CPU kernels, on the same inputs, without ONNX Runtime
// (scripts/gpu_check.sh builds and runs it; docs/cuda.md says what it checks).
//
//   gpu_check --cases DIR [--out FILE.json] [--cpu-only] [--no-large] [--no-timing] [--memcheck]
//             [--ops OP,OP...] [--threads N] [--repeat N]
//
// Per op: every golden case of DIR (tools/gpu_check/export_cases.py) and the seeded random cases (random.cc),
// large ones included. Each case goes through the adapter's checks (ops.cc); a rejected golden case must be one
// TF rejects, with TF's message. The CPU kernels run it and are judged against TF's golden outputs by the
// suite's rules (judge.cc). With a GPU the launchers run it on a non-default stream three times (outputs
// poisoned with two different patterns, then every buffer misaligned by one element) and each run is judged
// against the CPU kernels by tests/cuda_support.py's rules (quantization and fused ops bit for bit, NaN payloads
// included; depthwise forward and input gradient bit for bit up to NaN payloads; the sums of batch norm and the
// filter gradient to the suite's tolerances), golden cases also against TF; the two aligned runs must give the
// same bits (determinism, no unwritten element). Then per op and type: one case captured in a CUDA graph and
// replayed on new inputs; a timing on NHWC 16x56x56x128 against a device-to-device copy of the same bytes.
// Without a GPU (or with --cpu-only) the CPU half runs: the goldens against the CPU kernels, the random cases on
// the CPU kernels (twice: thread pool and serial, same bits), the coverage of every registered type
// combination and layout, and the judge's self-test (doctored results must fail). --memcheck runs one case per
// op, type and layout on the GPU only (for compute-sanitizer). Writes FILE.json; exit status 1 on any problem.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "kernels/op_error.h"
#include "kernels/simd.h"

namespace gpu_check {
namespace {

// ------------------------------------------------------------------------------------------- thread pool

// The CPU kernels' Parallel over fresh threads per call (cases are few and large ones are what it is for).
unsigned g_threads = 1;

void RunTasks(void*, tfops::Parallel::TaskFn fn, void* arg, std::size_t n) {
  std::atomic<std::size_t> next{0};
  auto worker = [&] {
    for (std::size_t i = next++; i < n; i = next++) fn(arg, i);
  };
  std::vector<std::thread> threads;
  const std::size_t extra = std::min<std::size_t>(g_threads, n) - 1;
  for (std::size_t t = 0; t < extra; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
}

tfops::Parallel ParallelFor(const Case& c) {
  int64_t elements = 0;
  for (const Tensor& t : c.inputs) elements = std::max(elements, t.count());
  if (g_threads <= 1 || elements < (int64_t{1} << 16)) return tfops::Parallel();
  return tfops::Parallel(RunTasks, nullptr);
}

// ------------------------------------------------------------------------------------------------- JSON

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

std::string Number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string List(const std::vector<std::string>& items) {
  std::string s = "[";
  for (std::size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + Quote(items[i]);
  return s + "]";
}

// --------------------------------------------------------------------------------------------- results

struct Counts {
  int ran = 0, rejected = 0;
};

struct Row {
  std::string op, dtype;
  Counts golden, random, large, timed;
  int failed = 0, float64_passes = 0;
  std::string graph;  // "", "ok", or what went wrong
  std::size_t graph_nodes = 0;
  std::vector<Timing> timings;
  std::vector<std::string> timing_configs, timing_json;  // the note; the case as JSON (for torch_times.py)
};

struct Failure {
  std::string op, dtype, source, note;
  int index = 0;
  std::vector<std::string> problems;
};

struct Options {
  std::string cases_dir, out;
  bool cpu_only = false, large = true, timing = true, memcheck = false;
  std::vector<std::string> ops;
  int repeat = 25;
};

class Checker {
 public:
  Checker(const Options& o, bool gpu) : o_(o), gpu_(gpu) {}

  void RunOp(const std::string& op, const std::vector<Case>& golden) {
    std::vector<Case> random = RandomCases(op, o_.large && !o_.memcheck);
    if (o_.memcheck) {
      Memcheck(op, random);
      return;
    }
    CheckCoverage(op, random);
    const auto t0 = std::chrono::steady_clock::now();
    for (const Case& c : golden) Process(c);
    for (const Case& c : random) Process(c);
    SelfTest(op, random);
    if (!broken_) GraphChecks(random);
    random.clear();
    if (o_.timing && !broken_) {
      std::set<std::string> timed;
      for (const Case& c : TimingCases(op)) {
        timed.insert(Name(c.KeyType()));
        if (gpu_) {
          Process(c);
          Time(c);
        } else {  // the CPU half only prepares them (the checks accept them) and lists them, untimed
          try {
            const Prepared p = Prepare(c);
            Timing t;
            t.error = "";
            for (const Tensor& x : c.inputs)
              if (IsFloat(x.dtype)) t.bytes += static_cast<int64_t>(x.nbytes());
            for (const Tensor& y : p.outputs) t.bytes += static_cast<int64_t>(y.nbytes());
            Row& row = RowOf(c);
            row.timings.push_back(t);
            row.timing_configs.push_back(c.note + (c.Layout().empty() ? "" : " " + c.Layout()));
            row.timing_json.push_back(CaseJson(c));
          } catch (const std::exception& e) {
            Harness("timing case rejected: " + c.op + " " + c.note + ": " + e.what());
          }
        }
      }
      for (const std::vector<DType>& types : InputTypeCombinations(op)) {
        const DType t = op == "DepthwiseConv2dNativeBackpropInput" ? types[1] : types[0];
        if (!timed.count(Name(t))) Harness(op + ": no timing case of type " + Name(t));
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int failed = 0;
    for (const auto& kv : rows_)
      if (kv.second.op == op) failed += kv.second.failed;
    std::printf("gpu_check: %-42s %4zu golden, %3zu random cases: %s (%.1f s)\n", op.c_str(), golden.size(),
                RandomCasesCount(op), failed ? (std::to_string(failed) + " FAILED").c_str() : "ok", s);
    std::fflush(stdout);
  }

  void Harness(const std::string& what) { errors_.push_back(what); }
  bool ok() const {
    return failures_total_ == 0 && errors_.empty() && coverage_.empty() && self_test_.empty() && !broken_;
  }

  void Write(const std::string& path, const DeviceInfo& device, double seconds) {
    std::ostringstream j;
    j << "{\n  \"format\": \"tfops-gpu-check 1\",\n";
    j << "  \"mode\": " << Quote(o_.memcheck ? "memcheck" : gpu_ ? "gpu" : "cpu") << ",\n";
    j << "  \"device\": ";
    if (device.ok) {
      j << "{\"name\": " << Quote(device.name) << ", \"compute_capability\": " << Quote(std::to_string(device.major) + "." + std::to_string(device.minor))
        << ", \"multiprocessors\": " << device.multiprocessors << ", \"memory_gib\": " << Number(device.memory_gib)
        << ", \"driver\": " << Quote(device.driver) << ", \"runtime\": " << Quote(device.runtime) << "},\n";
    } else {
      j << "null,\n  \"no_device\": " << Quote(device.why) << ",\n";
    }
    j << "  \"cpu_isa\": " << Quote(tfops::IsaName(tfops::ActiveIsa())) << ",\n";
    j << "  \"threads\": " << g_threads << ",\n  \"seconds\": " << Number(seconds) << ",\n";
    j << "  \"large\": " << (o_.large ? "true" : "false") << ", \"timing\": " << (o_.timing ? "true" : "false") << ",\n";
    j << "  \"rows\": [";
    bool first = true;
    for (const auto& kv : rows_) {
      const Row& r = kv.second;
      j << (first ? "\n" : ",\n") << "    {\"op\": " << Quote(r.op) << ", \"dtype\": " << Quote(r.dtype)
        << ", \"golden_ran\": " << r.golden.ran << ", \"golden_rejected\": " << r.golden.rejected
        << ", \"random_ran\": " << r.random.ran << ", \"random_rejected\": " << r.random.rejected
        << ", \"large_ran\": " << r.large.ran << ", \"failed\": " << r.failed
        << ", \"float64_passes\": " << r.float64_passes << ", \"graph\": " << (r.graph.empty() ? "null" : Quote(r.graph))
        << ", \"graph_nodes\": " << r.graph_nodes << ", \"timings\": [";
      for (std::size_t k = 0; k < r.timings.size(); ++k) {
        const Timing& t = r.timings[k];
        j << (k ? ", " : "") << "{\"config\": " << Quote(r.timing_configs[k]) << ", \"case\": " << r.timing_json[k]
          << ", \"bytes\": " << t.bytes
          << ", \"kernel_us\": " << Number(t.kernel_us) << ", \"launch_us\": " << Number(t.launch_us)
          << ", \"copy_us\": " << Number(t.copy_us) << ", \"error\": " << (t.error.empty() ? "null" : Quote(t.error)) << "}";
      }
      j << "]}";
      first = false;
    }
    j << "\n  ],\n  \"failures_total\": " << failures_total_ << ",\n  \"failures\": [";
    for (std::size_t i = 0; i < failures_.size(); ++i) {
      const Failure& f = failures_[i];
      j << (i ? ",\n" : "\n") << "    {\"op\": " << Quote(f.op) << ", \"dtype\": " << Quote(f.dtype) << ", \"source\": "
        << Quote(f.source) << ", \"index\": " << f.index << ", \"note\": " << Quote(f.note)
        << ", \"problems\": " << List(f.problems) << "}";
    }
    j << "\n  ],\n  \"coverage_missing\": " << List(coverage_) << ",\n  \"self_test_checks\": " << self_test_checks_
      << ",\n  \"self_test_problems\": " << List(self_test_) << ",\n  \"memcheck_cases\": " << List(memcheck_cases_)
      << ",\n  \"errors\": " << List(errors_) << ",\n  \"device_broken\": " << (broken_ ? "true" : "false")
      << ",\n  \"ok\": " << (ok() ? "true" : "false") << "\n}\n";
    std::ofstream(path) << j.str();
  }

  void PrintSummary() const {
    for (std::size_t i = 0; i < failures_.size() && i < 40; ++i) {
      const Failure& f = failures_[i];
      std::printf("FAIL %s %s %s case %d [%s]\n", f.op.c_str(), f.dtype.c_str(), f.source.c_str(), f.index, f.note.c_str());
      for (std::size_t k = 0; k < f.problems.size() && k < 4; ++k) std::printf("     %s\n", f.problems[k].c_str());
    }
    for (const std::string& s : coverage_) std::printf("COVERAGE %s\n", s.c_str());
    for (const std::string& s : self_test_) std::printf("SELF-TEST %s\n", s.c_str());
    for (const std::string& s : errors_) std::printf("ERROR %s\n", s.c_str());
  }

 private:
  Row& RowOf(const Case& c) {
    const std::string dtype = Name(c.KeyType());
    Row& r = rows_[c.op + "/" + dtype];
    r.op = c.op;
    r.dtype = dtype;
    return r;
  }

  std::size_t RandomCasesCount(const std::string& op) const {
    std::size_t n = 0;
    for (const auto& kv : rows_)
      if (kv.second.op == op) n += kv.second.random.ran + kv.second.random.rejected + kv.second.large.ran;
    return n;
  }

  void Fail(const Case& c, std::vector<std::string> problems) {
    Row& r = RowOf(c);
    ++r.failed;
    ++failures_total_;
    if (r.failed <= 20) failures_.push_back({c.op, r.dtype, c.source, c.note, c.index, std::move(problems)});
  }

  static void Prefix(std::vector<std::string>* problems, const std::string& prefix, std::vector<std::string> more) {
    for (std::string& p : more) problems->push_back(prefix + p);
  }

  void Count(const Case& c, bool rejected) {
    Row& r = RowOf(c);
    Counts& n = c.source == "golden" ? r.golden : c.source == "large" ? r.large : c.source == "timing" ? r.timed : r.random;
    (rejected ? n.rejected : n.ran)++;
  }

  // One case: the checks, the CPU kernels, and on a GPU the three device runs.
  void Process(const Case& c) {
    std::vector<std::string> problems;
    Prepared p;
    try {
      p = Prepare(c);
    } catch (const tfops::OpError& e) {
      Count(c, true);
      if (c.source == "golden") {
        if (c.has_expected) {
          problems.push_back(std::string("rejected what TF runs: ") + e.what());
        } else {
          const std::string phrase = BitExactFamily(c.op) ? KeyPhrase(c.error) : c.error;
          if (std::string(e.what()).find(phrase) == std::string::npos)
            problems.push_back(std::string("message '") + e.what() + "' lacks TF's '" + phrase + "'");
        }
      }
      if (!problems.empty()) Fail(c, problems);
      return;
    } catch (const std::exception& e) {
      Count(c, true);
      Fail(c, {std::string("harness: ") + e.what()});
      return;
    }
    Count(c, false);
    if (c.source == "golden" && !c.has_expected) {
      Fail(c, {"accepted what TF rejects: " + c.error});
      return;
    }
    std::vector<Tensor> cpu;
    try {
      cpu = RunCpu(c, p, ParallelFor(c));
      if (!gpu_ && c.source != "golden") {  // the thread count must not change a bit
        std::vector<Tensor> serial = RunCpu(c, p, tfops::Parallel());
        for (std::size_t k = 0; k < cpu.size(); ++k) {
          const std::string why = BitsMismatch(cpu[k], serial[k]);
          if (!why.empty()) problems.push_back("CPU kernels, pool against serial, output " + std::to_string(k) + ": " + why);
        }
      }
    } catch (const std::exception& e) {
      Fail(c, {std::string("CPU kernels threw: ") + e.what()});
      return;
    }
    if (c.source == "golden") Prefix(&problems, "CPU against TF: ", Judge(c, c.expected, cpu, Against::kGolden, &cpu));
    if (gpu_) {
      if (broken_) {
        problems.push_back("not run on the GPU: an earlier CUDA error left the context unusable");
      } else {
        GpuRuns(c, p, cpu, &problems);
      }
    }
    if (!problems.empty()) Fail(c, problems);
  }

  void GpuRuns(const Case& c, const Prepared& p, const std::vector<Tensor>& cpu, std::vector<std::string>* problems) {
    Row& row = RowOf(c);
    DeviceRun runs[3];
    for (int v = 0; v < 3; ++v) {
      runs[v] = RunOnDevice(c, p, v);
      if (!runs[v].error.empty()) {
        problems->push_back("GPU run " + std::to_string(v) + ": " + runs[v].error);
        if (runs[v].broken) broken_ = true;
        return;
      }
    }
    Prefix(problems, "GPU against CPU: ", Judge(c, cpu, runs[0].outputs, Against::kCpu, &cpu, &row.float64_passes));
    if (c.source == "golden") Prefix(problems, "GPU against TF: ", Judge(c, c.expected, runs[0].outputs, Against::kGolden, &cpu));
    for (std::size_t k = 0; k < runs[0].outputs.size(); ++k) {
      const std::string why = BitsMismatch(runs[0].outputs[k], runs[1].outputs[k]);
      if (!why.empty()) problems->push_back("GPU second run (other output poison), output " + std::to_string(k) + ": " + why);
    }
    int unused = 0;
    Prefix(problems, "GPU misaligned buffers against CPU: ", Judge(c, cpu, runs[2].outputs, Against::kCpu, &cpu, &unused));
    const bool batch_norm = c.op.rfind("FusedBatchNorm", 0) == 0 && c.op != "FusedBatchNormClipFakeQuant";
    if (batch_norm) {  // docs/cuda.md: the same bits for any buffer alignment
      for (std::size_t k = 0; k < runs[0].outputs.size(); ++k) {
        const std::string why = BitsMismatch(runs[0].outputs[k], runs[2].outputs[k]);
        if (!why.empty()) problems->push_back("GPU misaligned run differs from the aligned one, output " + std::to_string(k) + ": " + why);
      }
    }
  }

  // Per type: the random case that runs with the most elements (at most 2^20), captured in a CUDA graph and
  // replayed on its inputs (A), new inputs (B) and A again. Without a GPU the same choice, input set B and CPU
  // results are made, and B must change the results (else the replay would prove nothing).
  void GraphChecks(const std::vector<Case>& random) {
    std::map<std::string, const Case*> chosen;
    std::map<std::string, int64_t> size;
    for (const Case& a : random) {
      if (a.source != "random") continue;
      int64_t largest = 0;
      for (const Tensor& t : a.inputs) largest = std::max(largest, t.count());
      const std::string dtype = Name(a.KeyType());
      if (largest > (int64_t{1} << 20) || (chosen.count(dtype) && size[dtype] >= largest)) continue;
      try {
        Prepare(a);
      } catch (const std::exception&) {
        continue;
      }
      chosen[dtype] = &a;
      size[dtype] = largest;
    }
    for (const auto& kv : chosen) {
      const Case& a = *kv.second;
      Row& row = RowOf(a);
      std::vector<std::string> problems;
      try {
        const Prepared pa = Prepare(a);
        const Case b = Perturbed(a, pa);
        const std::vector<Tensor> want_a = RunCpu(a, pa, ParallelFor(a));
        const Prepared pb = Prepare(b);
        const std::vector<Tensor> want_b = RunCpu(b, pb, ParallelFor(b));
        bool changed = false;
        for (std::size_t k = 0; k < want_a.size(); ++k) changed = changed || !BitsMismatch(want_a[k], want_b[k]).empty();
        if (!changed) problems.push_back("graph check: the new inputs give the same outputs");
        if (gpu_ && problems.empty()) {
          const GraphRun g = GraphOnDevice(a, pa, {&a, &b, &a});
          row.graph_nodes = g.nodes;
          if (!g.error.empty()) {
            problems.push_back("CUDA graph: " + g.error);
            if (g.broken) broken_ = true;
          } else {
            Prefix(&problems, "graph replay 1 (A): ", Judge(a, want_a, g.outputs[0], Against::kCpu, &want_a));
            Prefix(&problems, "graph replay 2 (B): ", Judge(b, want_b, g.outputs[1], Against::kCpu, &want_b));
            Prefix(&problems, "graph replay 3 (A): ", Judge(a, want_a, g.outputs[2], Against::kCpu, &want_a));
            for (std::size_t k = 0; k < g.outputs[0].size(); ++k) {
              const std::string why = BitsMismatch(g.outputs[0][k], g.outputs[2][k]);
              if (!why.empty()) problems.push_back("graph replay 3 differs from replay 1, output " + std::to_string(k) + ": " + why);
            }
          }
        }
      } catch (const std::exception& e) {
        problems.push_back(std::string("graph check threw: ") + e.what());
      }
      if (gpu_) row.graph = problems.empty() ? "ok" : problems[0];
      if (!problems.empty()) {
        Case shown = a;
        shown.source = "graph";
        Fail(shown, problems);
      }
    }
  }

  // Input set B for a graph replay: every device input as large as the largest replaced by new values.
  static Case Perturbed(const Case& a, const Prepared& p) {
    Case b = a;
    int64_t largest = 0;
    for (const Tensor& t : a.inputs) largest = std::max(largest, t.count());
    uint64_t state = 0x2545F4914F6CDD1Dull;
    for (std::size_t i = 0; i < b.inputs.size(); ++i) {
      Tensor& t = b.inputs[i];
      if (p.host_input[i] || !IsFloat(t.dtype) || t.count() != largest) continue;
      for (int64_t k = 0; k < t.count(); ++k) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        const double v = (static_cast<double>(state >> 11) * 0x1.0p-53 - 0.5) * 4.0;
        switch (t.dtype) {
          case DType::kF32:
            t.as<float>()[k] = static_cast<float>(v);
            break;
          case DType::kF64:
            t.as<double>()[k] = v;
            break;
          default: {  // 16-bit: keep the bits of a nearby value of the type (any value will do)
            const uint16_t old = t.as<uint16_t>()[k];
            t.as<uint16_t>()[k] = static_cast<uint16_t>((old & 0x8000u) ^ (state & 0x8000u)) | (old & 0x7fffu);
          }
        }
      }
    }
    b.note = a.note + " (new inputs)";
    return b;
  }

  void Time(const Case& c) {
    Prepared p;
    try {
      p = Prepare(c);
    } catch (const std::exception& e) {
      Harness("timing case rejected: " + c.op + " " + c.note + ": " + e.what());
      return;
    }
    Timing t = TimeOnDevice(c, p, o_.repeat);
    if (t.broken) broken_ = true;
    Row& row = RowOf(c);
    row.timings.push_back(t);
    row.timing_configs.push_back(c.note + (c.Layout().empty() ? "" : " " + c.Layout()));
    row.timing_json.push_back(CaseJson(c));
  }

  // The op, its attributes and its inputs (shapes and dtypes; the values of those with at most 256 elements).
  static std::string CaseJson(const Case& c) {
    std::ostringstream j;
    j << "{\"op\": " << Quote(c.op) << ", \"attrs\": {";
    bool first = true;
    for (const auto& kv : c.attrs) {
      j << (first ? "" : ", ") << Quote(kv.first) << ": ";
      const AttrValue& v = kv.second;
      if (v.kind == 'i') j << v.i;
      else if (v.kind == 'f') j << Number(v.f);
      else if (v.kind == 's') j << Quote(v.s);
      else {
        j << "[";
        for (std::size_t i = 0; i < v.l.size(); ++i) j << (i ? ", " : "") << v.l[i];
        j << "]";
      }
      first = false;
    }
    j << "}, \"inputs\": [";
    for (std::size_t i = 0; i < c.inputs.size(); ++i) {
      const Tensor& t = c.inputs[i];
      j << (i ? ", " : "") << "{\"dtype\": " << Quote(Name(t.dtype)) << ", \"shape\": [";
      for (std::size_t d = 0; d < t.shape.size(); ++d) j << (d ? ", " : "") << t.shape[d];
      j << "]";
      if (t.count() <= 256) {
        j << ", \"values\": [";
        for (int64_t k = 0; k < t.count(); ++k) j << (k ? ", " : "") << Number(t.At(k));
        j << "]";
      }
      j << "}";
    }
    j << "]}";
    return j.str();
  }

  // Every registered type combination and every layout must be run by some random case.
  void CheckCoverage(const std::string& op, const std::vector<Case>& random) {
    std::set<std::vector<DType>> seen;
    std::set<std::string> layouts;
    for (const Case& c : random) {
      try {
        Prepare(c);
      } catch (const std::exception&) {
        continue;
      }
      std::vector<DType> types;
      for (const Tensor& t : c.inputs) types.push_back(t.dtype);
      seen.insert(types);
      layouts.insert(c.Layout());
    }
    for (const std::vector<DType>& combination : InputTypeCombinations(op)) {
      if (seen.count(combination)) continue;
      std::string names;
      for (DType t : combination) names += std::string(names.empty() ? "" : ",") + Name(t);
      coverage_.push_back(op + ": no random case runs the type combination (" + names + ")");
    }
    for (const std::string& layout : LayoutChoices(op))
      if (!layouts.count(layout)) coverage_.push_back(op + ": no random case runs data_format " + layout);
  }

  // The judge itself: the CPU result against itself passes; a changed last bit fails the bit-for-bit rules and
  // passes the tolerances; a negated result fails every rule.
  void SelfTest(const std::string& op, const std::vector<Case>& random) {
    for (const Case& c : random) {
      if (c.source != "random") continue;
      Prepared p;
      try {
        p = Prepare(c);
      } catch (const std::exception&) {
        continue;
      }
      const std::vector<Tensor> want = RunCpu(c, p, ParallelFor(c));
      int64_t at = -1;
      for (int64_t i = 0; i < want[0].count() && at < 0; ++i) {
        const double v = want[0].At(i);
        if (std::isfinite(v) && v != 0 && std::fabs(v) > 1e-3) at = i;
      }
      if (at < 0) continue;
      ++self_test_checks_;
      if (!Judge(c, want, want, Against::kCpu, &want).empty()) self_test_.push_back(op + ": a result does not pass against itself");
      std::vector<Tensor> flipped = want;
      switch (SizeOf(flipped[0].dtype)) {
        case 8:
          flipped[0].as<uint64_t>()[at] ^= 1;
          break;
        case 4:
          flipped[0].as<uint32_t>()[at] ^= 1;
          break;
        default:
          flipped[0].as<uint16_t>()[at] ^= 1;
      }
      const bool exact = BitExactFamily(op) || op == "DepthwiseConv2dNative" || op == "DepthwiseConv2dNativeBackpropInput";
      const bool caught = !Judge(c, want, flipped, Against::kCpu, &want).empty();
      if (exact != caught)
        self_test_.push_back(op + ": a last-bit change " + (caught ? "fails a tolerance rule" : "passes the bit-for-bit rule"));
      std::vector<Tensor> negated = want;
      for (int64_t i = 0; i < negated[0].count(); ++i) {
        const uint64_t sign = uint64_t{1} << (8 * SizeOf(negated[0].dtype) - 1);
        const double v = negated[0].At(i);
        if (!std::isfinite(v) || v == 0) continue;
        switch (SizeOf(negated[0].dtype)) {
          case 8:
            negated[0].as<uint64_t>()[i] ^= sign;
            break;
          case 4:
            negated[0].as<uint32_t>()[i] ^= static_cast<uint32_t>(sign);
            break;
          default:
            negated[0].as<uint16_t>()[i] ^= static_cast<uint16_t>(sign);
        }
      }
      if (Judge(c, want, negated, Against::kCpu, &want).empty()) self_test_.push_back(op + ": a negated result passes");
      return;  // one case per op
    }
    self_test_.push_back(op + ": no random case with a nonzero finite output to test the judge on");
  }

  // One case per type and layout (the first that runs), on the GPU only: for compute-sanitizer.
  void Memcheck(const std::string& op, const std::vector<Case>& random) {
    std::set<std::string> done;
    for (const Case& c : random) {
      const std::string key = std::string(Name(c.KeyType())) + " " + c.Layout();
      if (done.count(key) || c.inputs.empty()) continue;
      int64_t largest = 0;
      for (const Tensor& t : c.inputs) largest = std::max(largest, t.count());
      if (largest < 64 || largest > (int64_t{1} << 18)) continue;
      Prepared p;
      try {
        p = Prepare(c);
      } catch (const std::exception&) {
        continue;
      }
      done.insert(key);
      memcheck_cases_.push_back(op + " " + key + " [" + c.note + "]");
      for (int v : {0, 2}) {
        const DeviceRun r = RunOnDevice(c, p, v);
        if (!r.error.empty()) {
          Fail(c, {"GPU run under memcheck: " + r.error});
          if (r.broken) broken_ = true;
          return;
        }
      }
    }
  }

  const Options& o_;
  const bool gpu_;
  bool broken_ = false;
  std::map<std::string, Row> rows_;
  std::vector<Failure> failures_;
  int failures_total_ = 0;
  std::vector<std::string> coverage_, self_test_, errors_, memcheck_cases_;
  int self_test_checks_ = 0;
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

int Main(int argc, char** argv) {
  Options o;
  g_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--cases") o.cases_dir = value();
    else if (a == "--out") o.out = value();
    else if (a == "--cpu-only") o.cpu_only = true;
    else if (a == "--no-large") o.large = false;
    else if (a == "--no-timing") o.timing = false;
    else if (a == "--memcheck") o.memcheck = true;
    else if (a == "--ops") o.ops = Split(value());
    else if (a == "--threads") g_threads = static_cast<unsigned>(std::max(1, std::atoi(value().c_str())));
    else if (a == "--repeat") o.repeat = std::max(3, std::atoi(value().c_str()));
    else if (a == "--help" || a == "-h") {
      std::printf("usage: gpu_check --cases DIR [--out FILE.json] [--cpu-only] [--no-large] [--no-timing] "
                  "[--memcheck] [--ops OP,OP] [--threads N] [--repeat N]\n");
      return 0;
    } else {
      throw std::runtime_error("unknown argument " + a);
    }
  }
  if (o.cases_dir.empty()) throw std::runtime_error("--cases DIR is required (tools/gpu_check/export_cases.py writes it)");
  const auto t0 = std::chrono::steady_clock::now();
  DeviceInfo device;
  device.why = "--cpu-only";
  if (!o.cpu_only) device = ProbeDevice();
  if (o.memcheck && !device.ok) throw std::runtime_error("--memcheck needs a GPU: " + device.why);
  const bool gpu = device.ok;
  std::printf("gpu_check: %s; CPU kernels: %s, %u threads\n",
              gpu ? ("GPU " + device.name + " (sm_" + std::to_string(device.major) + std::to_string(device.minor) + ")").c_str()
                  : ("no GPU run (" + device.why + "): the CPU half only").c_str(),
              tfops::IsaName(tfops::ActiveIsa()), g_threads);
  std::vector<std::string> missing;
  std::vector<Case> golden = ReadGoldenCases(o.cases_dir, &missing);
  Checker checker(o, gpu);
  for (const std::string& op : missing) checker.Harness("no golden case file for " + op + " in " + o.cases_dir);
  std::vector<std::string> ops = o.ops.empty() ? AllOps() : o.ops;
  for (const std::string& op : ops) {
    std::vector<Case> mine;
    for (Case& c : golden)
      if (c.op == op) mine.push_back(std::move(c));
    try {
      checker.RunOp(op, o.memcheck ? std::vector<Case>{} : mine);
    } catch (const std::exception& e) {
      checker.Harness(op + ": " + e.what());
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  checker.PrintSummary();
  if (!o.out.empty()) checker.Write(o.out, device, seconds);
  std::printf("gpu_check: %s in %.1f s%s\n", checker.ok() ? "all checks passed" : "FAILED", seconds,
              o.out.empty() ? "" : (", results in " + o.out).c_str());
  return checker.ok() ? 0 : 1;
}

}  // namespace
}  // namespace gpu_check

#if !GPU_CHECK_WITH_CUDA
namespace gpu_check {
// The CPU-only build: no CUDA half.
DeviceInfo ProbeDevice() {
  DeviceInfo info;
  info.why = "built without CUDA";
  return info;
}
DeviceRun RunOnDevice(const Case&, const Prepared&, int) { return {{}, "built without CUDA", false}; }
GraphRun GraphOnDevice(const Case&, const Prepared&, const std::vector<const Case*>&) { return {{}, "built without CUDA", false, 0}; }
Timing TimeOnDevice(const Case&, const Prepared&, int) {
  Timing t;
  t.error = "built without CUDA";
  return t;
}
}  // namespace gpu_check
#endif

int main(int argc, char** argv) {
  try {
    return gpu_check::Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_check: %s\n", e.what());
    return 2;
  }
}
