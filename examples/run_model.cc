// run_model: serve a converted model with ONNX Runtime's C++ API and the tf-ort-ops custom-op library.
//
// What a C or C++ server does: load the ONNX Runtime shared library, register libort_tf_ops.so on the session
// options (Ort::SessionOptions::RegisterCustomOpsLibrary), pick the CUDA execution provider when the runtime
// offers it and the CPU one otherwise, create the session, feed the inputs, run, read the outputs.
//
//   run_model --model models/fourbit_cnn/model.custom.onnx --library path/to/libort_tf_ops.so
//             --ort path/to/libonnxruntime.so.1.xx [--input images=images.npy] [--output-dir out]
//
// `run_model --help` lists every option. ONNX Runtime is opened with dlopen (its path is an option), so the
// program has no link-time dependency on it. It asks for C API 17, as the custom-op library does, and calls no
// function added after it, so it runs on onnxruntime 1.17 and every later version, whichever headers (1.17 or
// newer) it was built with (scripts/test_ort_versions.sh runs it on each). Inputs come from .npy files or, for those not given, from a deterministic
// pattern; with --output-dir every input fed and every output is written as .npy (scripts/example.sh runs the
// same model through Python onnxruntime on those inputs and compares the outputs bit for bit).
// Exit status: 0 on success, 1 on any error (the message says what failed), 2 on a bad command line.

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

// ------------------------------------------------------------------------------------------- errors

// A failure the user can act on; main() prints it and exits with status 1.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A bad command line; main() prints it with the usage hint and exits with status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---------------------------------------------------------------------------------- element types

struct ElementType {
  ONNXTensorElementDataType onnx;
  const char* name;  // as numpy names it
  const char* npy;   // .npy descr on a little-endian machine (bfloat16: its bits, as uint16)
  size_t size;
  bool is_float;
};

constexpr ElementType kElementTypes[] = {
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "float32", "<f4", 4, true},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, "float64", "<f8", 8, true},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "float16", "<f2", 2, true},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16, "bfloat16", "<u2", 2, true},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, "int8", "|i1", 1, false},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, "uint8", "|u1", 1, false},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16, "int16", "<i2", 2, false},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16, "uint16", "<u2", 2, false},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, "int32", "<i4", 4, false},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32, "uint32", "<u4", 4, false},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, "int64", "<i8", 8, false},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64, "uint64", "<u8", 8, false},
    {ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, "bool", "|b1", 1, false},
};

const ElementType& LookUp(ONNXTensorElementDataType type, const std::string& what) {
  for (const ElementType& t : kElementTypes) {
    if (t.onnx == type) return t;
  }
  throw Error(what + " has ONNX element type " + std::to_string(static_cast<int>(type)) +
              ", which this example does not handle");
}

// A descr read from a file matches ours up to the byte-order mark: '<', '=' and '|' all mean this machine's
// (little-endian) order for the sizes involved.
bool SameDescr(const std::string& file_descr, const char* ours) {
  if (file_descr.size() != 3 || std::strlen(ours) != 3) return false;
  const char order = file_descr[0];
  if (order != '<' && order != '=' && order != '|') return false;
  return file_descr.compare(1, 2, ours + 1) == 0;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

size_t ElementCount(const std::vector<int64_t>& shape, const std::string& what) {
  size_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error(what + " has a negative dimension: " + ShapeString(shape));
    if (d != 0 && n > SIZE_MAX / static_cast<size_t>(d)) throw Error(what + " is too large: " + ShapeString(shape));
    n *= static_cast<size_t>(d);
  }
  return n;
}

// A tensor in host memory, as fed to or read from the session.
struct HostTensor {
  const ElementType* type = nullptr;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
};

// ----------------------------------------------------------------------------------------- .npy I/O

// The value of `key` in a .npy header dict ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }").
std::string HeaderField(const std::string& header, const std::string& key, const std::string& path) {
  const std::string quoted = "'" + key + "'";
  size_t at = header.find(quoted);
  if (at == std::string::npos) throw Error(path + ": .npy header has no " + quoted);
  at = header.find(':', at + quoted.size());
  if (at == std::string::npos) throw Error(path + ": malformed .npy header");
  ++at;
  while (at < header.size() && header[at] == ' ') ++at;
  if (at >= header.size()) throw Error(path + ": malformed .npy header");
  size_t end;
  if (header[at] == '\'') {
    end = header.find('\'', at + 1);
    if (end == std::string::npos) throw Error(path + ": malformed .npy header");
    return header.substr(at + 1, end - at - 1);
  }
  if (header[at] == '(') {
    end = header.find(')', at);
    if (end == std::string::npos) throw Error(path + ": malformed .npy header");
    return header.substr(at, end - at + 1);
  }
  end = header.find_first_of(",}", at);
  if (end == std::string::npos) throw Error(path + ": malformed .npy header");
  return header.substr(at, end - at);
}

HostTensor ReadNpy(const std::string& path, const ElementType& expected, const std::string& input_name) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open " + path + " (input '" + input_name + "')");
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw Error(path + ": not a .npy file");
  const int major = static_cast<unsigned char>(magic[6]);
  uint32_t header_len = 0;
  unsigned char len_bytes[4] = {0, 0, 0, 0};
  if (major == 1) {
    if (!in.read(reinterpret_cast<char*>(len_bytes), 2)) throw Error(path + ": truncated .npy header");
    header_len = len_bytes[0] | (len_bytes[1] << 8);
  } else if (major == 2 || major == 3) {
    if (!in.read(reinterpret_cast<char*>(len_bytes), 4)) throw Error(path + ": truncated .npy header");
    header_len = len_bytes[0] | (len_bytes[1] << 8) | (len_bytes[2] << 16) | (static_cast<uint32_t>(len_bytes[3]) << 24);
  } else {
    throw Error(path + ": unsupported .npy format version " + std::to_string(major));
  }
  if (header_len > (1u << 20)) throw Error(path + ": .npy header too long");
  std::string header(header_len, '\0');
  if (!in.read(&header[0], header_len)) throw Error(path + ": truncated .npy header");

  const std::string descr = HeaderField(header, "descr", path);
  if (!SameDescr(descr, expected.npy)) {
    throw Error(path + ": holds '" + descr + "' but input '" + input_name + "' is " + expected.name + " ('" +
                expected.npy + "')");
  }
  if (HeaderField(header, "fortran_order", path) != "False") {
    throw Error(path + ": Fortran-ordered arrays are not supported (save with np.ascontiguousarray)");
  }
  HostTensor t;
  t.type = &expected;
  const std::string shape = HeaderField(header, "shape", path);
  if (shape.size() < 2 || shape.front() != '(') throw Error(path + ": bad shape " + shape + " in .npy header");
  std::string dims = shape.substr(1, shape.size() - 2);
  std::replace(dims.begin(), dims.end(), ',', ' ');
  std::istringstream dim_stream(dims);
  std::string token;
  while (dim_stream >> token) {
    try {
      size_t used = 0;
      const long long d = std::stoll(token, &used);
      if (used != token.size() || d < 0) throw std::invalid_argument(token);
      t.shape.push_back(d);
    } catch (const std::exception&) {
      throw Error(path + ": bad shape " + shape + " in .npy header");
    }
  }
  const size_t count = ElementCount(t.shape, path);
  std::error_code ec;
  const uintmax_t file_size = std::filesystem::file_size(path, ec);
  const uintmax_t data_start = static_cast<uintmax_t>(in.tellg());
  if (ec || count > SIZE_MAX / expected.size || file_size < data_start ||
      count * expected.size > file_size - data_start) {
    throw Error(path + ": file is shorter than its shape " + shape + " says");
  }
  t.bytes.resize(count * expected.size);
  if (!t.bytes.empty() && !in.read(reinterpret_cast<char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()))) {
    throw Error(path + ": file is shorter than its shape " + shape + " says");
  }
  return t;
}

void WriteNpy(const std::filesystem::path& path, const HostTensor& t) {
  std::string dims = "(";
  for (size_t i = 0; i < t.shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(t.shape[i]);
  dims += t.shape.size() == 1 ? ",)" : ")";
  std::string header = std::string("{'descr': '") + t.type->npy + "', 'fortran_order': False, 'shape': " + dims + ", }";
  // Format 1.0: magic (6) + version (2) + length (2) + header, padded with spaces and ended by '\n' so that the
  // data starts at a multiple of 64 bytes.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  if (header.size() > 65535) throw Error(path.string() + ": .npy header too long");
  std::ofstream out(path, std::ios::binary);
  const unsigned char preamble[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<unsigned char>(header.size() & 0xff),
                                      static_cast<unsigned char>(header.size() >> 8)};
  out.write(reinterpret_cast<const char*>(preamble), 10);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
  if (!out) throw Error("cannot write " + path.string());
}

// --------------------------------------------------------------------------------- pattern inputs

// Deterministic values, the same on every machine: floating inputs get u / 2^22 - 2 in [-2, 2), u the top 24
// bits of a multiplicative hash of the index (exact in float32 and float64; float16 and bfloat16 round it to
// nearest even), integer inputs i mod int_range (e.g. class labels), booleans alternate.
HostTensor PatternTensor(const ElementType& type, std::vector<int64_t> shape, int64_t int_range) {
  HostTensor t;
  t.type = &type;
  t.shape = std::move(shape);
  const size_t n = ElementCount(t.shape, "pattern input");
  t.bytes.resize(n * type.size);
  unsigned char* p = t.bytes.data();
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(static_cast<uint32_t>(i) * 2654435761u) >> 8;
    const float f = static_cast<float>(u) * (1.0f / 4194304.0f) - 2.0f;
    const int64_t k = static_cast<int64_t>(i % static_cast<uint64_t>(int_range));
    auto put = [&](auto v) { std::memcpy(p + i * sizeof(v), &v, sizeof(v)); };
    switch (type.onnx) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: put(f); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: put(static_cast<double>(f)); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: put(Ort::Float16_t(f).val); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: put(Ort::BFloat16_t(f).val); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: put(static_cast<int8_t>(k)); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: put(static_cast<uint8_t>(k)); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: put(static_cast<int16_t>(k)); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: put(static_cast<uint16_t>(k)); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: put(static_cast<int32_t>(k)); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: put(static_cast<uint32_t>(k)); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: put(static_cast<int64_t>(k)); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: put(static_cast<uint64_t>(k)); break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: put(static_cast<uint8_t>(i % 2)); break;
      default: throw Error("pattern input: unhandled element type");
    }
  }
  return t;
}

// ------------------------------------------------------------------------------------ printing

// Element i of a tensor as a double, for the summary.
double ValueAt(const HostTensor& t, size_t i) {
  const unsigned char* p = t.bytes.data() + i * t.type->size;
  auto get = [p](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return v;
  };
  switch (t.type->onnx) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return get(float{});
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return get(double{});
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return Ort::Float16_t::FromBits(get(uint16_t{})).ToFloat();
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return Ort::BFloat16_t::FromBits(get(uint16_t{})).ToFloat();
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return get(int8_t{});
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return get(uint8_t{});
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return get(int16_t{});
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return get(uint16_t{});
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return get(int32_t{});
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return get(uint32_t{});
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return static_cast<double>(get(int64_t{}));
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return static_cast<double>(get(uint64_t{}));
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return get(uint8_t{}) != 0;
    default: return 0.0;
  }
}

// FNV-1a over the tensor's bytes: equal fingerprints on two runs mean (almost surely) identical bits.
uint64_t Fingerprint(const HostTensor& t) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char b : t.bytes) {
    h ^= b;
    h *= 1099511628211ull;
  }
  return h;
}

void PrintTensor(const char* kind, size_t index, const std::string& name, const HostTensor& t, size_t show) {
  const size_t n = t.bytes.size() / t.type->size;
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += ValueAt(t, i);
  char line[160];
  std::snprintf(line, sizeof line, "sum=%.9g fnv1a=%016llx", sum, static_cast<unsigned long long>(Fingerprint(t)));
  std::cout << kind << " " << index << " '" << name << "' " << t.type->name << " " << ShapeString(t.shape) << " "
            << line << "\n  first:";
  for (size_t i = 0; i < std::min(n, show); ++i) {
    std::snprintf(line, sizeof line, " %.9g", ValueAt(t, i));
    std::cout << line;
  }
  std::cout << (n > show ? " ..." : "") << "\n";
}

// ------------------------------------------------------------------------------------ command line

struct Options {
  std::string model;
  std::string library;
  std::string ort = "libonnxruntime.so.1";
  std::vector<std::pair<std::string, std::string>> inputs;       // name, .npy path
  std::vector<std::pair<std::string, std::string>> cuda_options;  // key, value
  std::string provider = "auto";
  std::string output_dir;
  int64_t free_dim = 1;
  int64_t int_range = 10;
  int threads = 0;
  int repeat = 1;
  size_t show = 6;
};

constexpr const char* kUsage = R"USAGE(usage: run_model --model MODEL.onnx --library libort_tf_ops.so [options]

Runs MODEL.onnx with ONNX Runtime and the tf-ort-ops custom-op library and prints every output.

  --model PATH             the ONNX model
  --library PATH           the custom-op library (python -c "import ort_ops; print(ort_ops.library_path())")
  --ort PATH               the ONNX Runtime shared library to dlopen, e.g. the onnxruntime wheel's
                           onnxruntime/capi/libonnxruntime.so.1.xx (default: libonnxruntime.so.1 from the
                           loader's search path)
  --provider auto|cpu|cuda auto (default): CUDAExecutionProvider when the runtime offers it, else CPU;
                           cuda: fail when it is not available
  --cuda-option KEY=VALUE  a CUDA execution provider option (e.g. device_id=1); repeatable
  --input NAME=FILE.npy    feed input NAME from FILE.npy (C order; bfloat16 as its uint16 bits); repeatable.
                           Inputs not given get a deterministic pattern: floats pseudo-random in [-2, 2)
                           (a hash of the index), integers i mod --int-range, booleans alternating
  --free-dim N             size of symbolic or unknown dims of pattern inputs (default 1)
  --int-range N            modulus of integer pattern inputs (default 10)
  --threads N              intra-op threads (default: ONNX Runtime's choice)
  --repeat N               run N times and print the timings (outputs are the last run's)
  --show N                 values printed per output (default 6)
  --output-dir DIR         write every input fed and every output as .npy, and DIR/manifest.tsv
  --help                   this text

Exit status: 0 on success, 1 on an error, 2 on a bad command line.
)USAGE";

int64_t ParseInt(const std::string& flag, const std::string& text, int64_t lowest) {
  try {
    size_t used = 0;
    const long long v = std::stoll(text, &used);
    if (used == text.size() && v >= lowest) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(flag + " needs an integer >= " + std::to_string(lowest) + ", got '" + text + "'");
}

std::pair<std::string, std::string> SplitPair(const std::string& flag, const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) throw UsageError(flag + " needs KEY=VALUE, got '" + text + "'");
  return {text.substr(0, eq), text.substr(eq + 1)};
}

Options ParseCommandLine(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      std::exit(0);
    }
    if (i + 1 >= argc) throw UsageError(flag.rfind("--", 0) == 0 ? flag + " needs a value" : "unexpected '" + flag + "'");
    const std::string value = argv[++i];
    if (flag == "--model") o.model = value;
    else if (flag == "--library") o.library = value;
    else if (flag == "--ort") o.ort = value;
    else if (flag == "--provider") o.provider = value;
    else if (flag == "--cuda-option") o.cuda_options.push_back(SplitPair(flag, value));
    else if (flag == "--input") o.inputs.push_back(SplitPair(flag, value));
    else if (flag == "--free-dim") o.free_dim = ParseInt(flag, value, 0);
    else if (flag == "--int-range") o.int_range = ParseInt(flag, value, 1);
    else if (flag == "--threads") o.threads = static_cast<int>(ParseInt(flag, value, 0));
    else if (flag == "--repeat") o.repeat = static_cast<int>(ParseInt(flag, value, 1));
    else if (flag == "--show") o.show = static_cast<size_t>(ParseInt(flag, value, 0));
    else if (flag == "--output-dir") o.output_dir = value;
    else throw UsageError("unknown option '" + flag + "'");
  }
  if (o.model.empty()) throw UsageError("--model is required");
  if (o.library.empty()) throw UsageError("--library is required");
  if (o.provider != "auto" && o.provider != "cpu" && o.provider != "cuda") {
    throw UsageError("--provider must be auto, cpu or cuda, got '" + o.provider + "'");
  }
  return o;
}

// ------------------------------------------------------------------------------------ ONNX Runtime

// The C API version asked for: onnxruntime 1.17's, the oldest the custom-op library supports. A later API table
// starts with this one, so every function this program calls is there on any runtime from 1.17 on.
constexpr uint32_t kOrtApiVersion = 17;
static_assert(ORT_API_VERSION >= kOrtApiVersion, "build with onnxruntime 1.17 headers or newer");

// Opens the runtime and points the C++ API at its API table. The handle stays open until the process ends.
void LoadOnnxRuntime(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw Error("cannot load ONNX Runtime from '" + path + "': " + (why ? why : "unknown error") +
                " (pass --ort with the path of libonnxruntime.so)");
  }
  using GetApiBaseFn = const OrtApiBase* (*)();
  auto get_api_base = reinterpret_cast<GetApiBaseFn>(dlsym(handle, "OrtGetApiBase"));
  if (get_api_base == nullptr) throw Error("'" + path + "' does not export OrtGetApiBase: not ONNX Runtime");
  const OrtApiBase* base = get_api_base();
  const OrtApi* api = base->GetApi(kOrtApiVersion);
  if (api == nullptr) {
    throw Error(std::string("ONNX Runtime ") + base->GetVersionString() + " at '" + path + "' does not offer C API " +
                std::to_string(kOrtApiVersion) + ": use onnxruntime 1.17 or newer");
  }
  Ort::InitApi(api);
  std::cout << "onnxruntime " << base->GetVersionString() << " (C API " << kOrtApiVersion << ") from " << path << "\n";
}

// How many ops of the custom-op library have a CUDA kernel (its exported TfOpsCudaKernelCount), or -1 when the
// library does not say (a build older than the CUDA kernels). ONNX Runtime has opened the library already; this
// takes and drops one more reference.
int CudaKernelCount(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return -1;
  using CountFn = int (*)();
  auto count = reinterpret_cast<CountFn>(dlsym(handle, "TfOpsCudaKernelCount"));
  const int n = count ? count() : -1;
  dlclose(handle);
  return n;
}

// Adds the CUDA execution provider. Returns false (with the reason in `why`) when it cannot be added.
bool AppendCuda(Ort::SessionOptions& session_options, const Options& o, std::string& why) {
  const OrtApi& api = Ort::GetApi();
  OrtCUDAProviderOptionsV2* raw = nullptr;
  Ort::ThrowOnError(api.CreateCUDAProviderOptions(&raw));
  std::unique_ptr<OrtCUDAProviderOptionsV2, void (*)(OrtCUDAProviderOptionsV2*)> cuda(raw, api.ReleaseCUDAProviderOptions);
  std::vector<const char*> keys, values;
  for (const auto& kv : o.cuda_options) {
    keys.push_back(kv.first.c_str());
    values.push_back(kv.second.c_str());
  }
  try {
    if (!keys.empty()) Ort::ThrowOnError(api.UpdateCUDAProviderOptions(cuda.get(), keys.data(), values.data(), keys.size()));
    session_options.AppendExecutionProvider_CUDA_V2(*cuda);
  } catch (const Ort::Exception& e) {
    why = e.what();
    return false;
  }
  return true;
}

std::string SafeFileName(const std::string& name) {
  std::string s = name;
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') c = '_';
  }
  return s;
}

int Run(const Options& o) {
  if (!std::filesystem::is_regular_file(o.model)) throw Error("no model file '" + o.model + "'");
  if (!std::filesystem::is_regular_file(o.library)) throw Error("no custom-op library '" + o.library + "'");
  LoadOnnxRuntime(o.ort);

  Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "run_model");
  Ort::SessionOptions session_options;
  if (o.threads > 0) session_options.SetIntraOpNumThreads(o.threads);
  // The one line that makes the domain ai.onnx.converters.tensorflow known to the session.
  session_options.RegisterCustomOpsLibrary(o.library.c_str());

  std::string provider = "CPUExecutionProvider";
  if (o.provider != "cpu") {
    const std::vector<std::string> available = Ort::GetAvailableProviders();
    const bool has_cuda = std::find(available.begin(), available.end(), "CUDAExecutionProvider") != available.end();
    std::string why = "this runtime does not offer CUDAExecutionProvider";
    if (has_cuda && AppendCuda(session_options, o, why)) {
      provider = "CUDAExecutionProvider";
    } else if (o.provider == "cuda") {
      throw Error("--provider cuda: " + why);
    } else {
      std::cout << "note: using the CPU execution provider: " << why << "\n";
    }
  }
  std::cout << "provider: " << provider << "\n";
  const int cuda_kernels = CudaKernelCount(o.library);
  std::cout << "custom-op library: " << o.library << " ("
            << (cuda_kernels < 0 ? std::string("does not report CUDA kernels")
                                 : std::to_string(cuda_kernels) + " ops with a CUDA kernel")
            << ")\n";
  if (provider == "CUDAExecutionProvider" && cuda_kernels <= 0) {
    std::cout << "note: the library has no CUDA kernels: ONNX Runtime runs the domain's nodes on the CPU\n";
  }

  Ort::Session session(env, o.model.c_str(), session_options);
  Ort::AllocatorWithDefaultOptions allocator;

  // Inputs: the .npy files given, a pattern for the others.
  const size_t input_count = session.GetInputCount();
  std::vector<std::string> input_names;
  std::vector<HostTensor> inputs;
  for (size_t i = 0; i < input_count; ++i) {
    input_names.push_back(session.GetInputNameAllocated(i, allocator).get());
    const std::string& name = input_names.back();
    Ort::TypeInfo info = session.GetInputTypeInfo(i);
    if (info.GetONNXType() != ONNX_TYPE_TENSOR) throw Error("input '" + name + "' is not a tensor");
    auto tensor_info = info.GetTensorTypeAndShapeInfo();
    const ElementType& type = LookUp(tensor_info.GetElementType(), "input '" + name + "'");
    const std::vector<int64_t> model_shape = tensor_info.GetShape();  // -1: symbolic or unknown

    auto given = std::find_if(o.inputs.begin(), o.inputs.end(), [&](const auto& kv) { return kv.first == name; });
    if (given != o.inputs.end()) {
      HostTensor t = ReadNpy(given->second, type, name);
      bool fits = t.shape.size() == model_shape.size();
      for (size_t d = 0; fits && d < t.shape.size(); ++d) fits = model_shape[d] < 0 || model_shape[d] == t.shape[d];
      if (!fits) {
        throw Error(given->second + ": shape " + ShapeString(t.shape) + " does not fit input '" + name + "' " +
                    ShapeString(model_shape) + " (-1: any size)");
      }
      inputs.push_back(std::move(t));
    } else {
      std::vector<int64_t> shape = model_shape;
      for (int64_t& d : shape) d = d < 0 ? o.free_dim : d;
      inputs.push_back(PatternTensor(type, shape, o.int_range));
    }
  }
  for (const auto& kv : o.inputs) {
    if (std::find(input_names.begin(), input_names.end(), kv.first) == input_names.end()) {
      std::string known;
      for (const std::string& n : input_names) known += (known.empty() ? "" : ", ") + n;
      throw Error("--input " + kv.first + ": the model has no such input (its inputs: " + known + ")");
    }
  }

  // Host tensors: on the CUDA EP, ONNX Runtime copies them to the device and copies the outputs back.
  Ort::MemoryInfo host = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<Ort::Value> input_values;
  uint64_t empty_buffer = 0;  // data pointer of empty tensors
  for (HostTensor& t : inputs) {
    void* data = t.bytes.empty() ? static_cast<void*>(&empty_buffer) : t.bytes.data();
    input_values.push_back(
        Ort::Value::CreateTensor(host, data, t.bytes.size(), t.shape.data(), t.shape.size(), t.type->onnx));
  }
  const size_t output_count = session.GetOutputCount();
  std::vector<std::string> output_names;
  for (size_t i = 0; i < output_count; ++i) output_names.push_back(session.GetOutputNameAllocated(i, allocator).get());
  std::vector<const char*> input_ptrs, output_ptrs;
  for (const std::string& n : input_names) input_ptrs.push_back(n.c_str());
  for (const std::string& n : output_names) output_ptrs.push_back(n.c_str());

  std::vector<Ort::Value> outputs;
  std::vector<double> times_ms;
  for (int r = 0; r < o.repeat; ++r) {
    const auto start = std::chrono::steady_clock::now();
    outputs = session.Run(Ort::RunOptions{nullptr}, input_ptrs.data(), input_values.data(), input_values.size(),
                          output_ptrs.data(), output_ptrs.size());
    times_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }

  // Outputs: Run() without bound outputs returns them in host memory whatever the provider.
  std::vector<HostTensor> results;
  for (size_t i = 0; i < output_count; ++i) {
    const Ort::Value& v = outputs[i];
    if (!v.IsTensor()) throw Error("output '" + output_names[i] + "' is not a tensor");
    if (v.GetTensorMemoryInfo().GetDeviceType() != OrtMemoryInfoDeviceType_CPU) {
      throw Error("output '" + output_names[i] + "' is not in host memory");
    }
    auto info = v.GetTensorTypeAndShapeInfo();
    HostTensor t;
    t.type = &LookUp(info.GetElementType(), "output '" + output_names[i] + "'");
    t.shape = info.GetShape();
    t.bytes.resize(info.GetElementCount() * t.type->size);
    if (!t.bytes.empty()) std::memcpy(t.bytes.data(), v.GetTensorRawData(), t.bytes.size());
    results.push_back(std::move(t));
  }

  for (size_t i = 0; i < input_count; ++i) PrintTensor("input", i, input_names[i], inputs[i], o.show);
  for (size_t i = 0; i < output_count; ++i) PrintTensor("output", i, output_names[i], results[i], o.show);
  char line[160];
  if (o.repeat == 1) {
    std::snprintf(line, sizeof line, "run: %.3f ms", times_ms[0]);
  } else {
    std::vector<double> rest(times_ms.begin() + 1, times_ms.end());
    std::sort(rest.begin(), rest.end());
    std::snprintf(line, sizeof line, "run: first %.3f ms, median of the next %zu %.3f ms", times_ms[0], rest.size(),
                  rest[rest.size() / 2]);
  }
  std::cout << line << "\n";

  if (!o.output_dir.empty()) {
    const std::filesystem::path dir(o.output_dir);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error("cannot create " + o.output_dir + ": " + ec.message());
    std::ofstream manifest(dir / "manifest.tsv");
    manifest << "provider\t" << provider << "\n";
    for (size_t i = 0; i < input_count; ++i) {
      const std::string file = "input_" + std::to_string(i) + "_" + SafeFileName(input_names[i]) + ".npy";
      WriteNpy(dir / file, inputs[i]);
      manifest << "input\t" << i << "\t" << input_names[i] << "\t" << file << "\n";
    }
    for (size_t i = 0; i < output_count; ++i) {
      const std::string file = "output_" + std::to_string(i) + "_" + SafeFileName(output_names[i]) + ".npy";
      WriteNpy(dir / file, results[i]);
      manifest << "output\t" << i << "\t" << output_names[i] << "\t" << file << "\n";
    }
    if (!manifest) throw Error("cannot write " + (dir / "manifest.tsv").string());
    std::cout << "wrote " << input_count << " inputs and " << output_count << " outputs to " << o.output_dir << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  {
    const uint16_t one = 1;
    unsigned char first;
    std::memcpy(&first, &one, 1);
    if (first != 1) {
      std::cerr << "run_model: error: this example assumes a little-endian machine\n";
      return 1;
    }
  }
  Options options;
  try {
    options = ParseCommandLine(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "run_model: " << e.what() << "\n(run_model --help lists the options)\n";
    return 2;
  }
  try {
    return Run(options);
  } catch (const Ort::Exception& e) {
    std::cerr << "run_model: error: ONNX Runtime: " << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "run_model: error: " << e.what() << "\n";
  }
  return 1;
}
