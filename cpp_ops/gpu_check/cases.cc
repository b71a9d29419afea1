// Tensors, the golden case files (tools/gpu_check/export_cases.py documents the format) and attribute access
// through the op table that the library's adapters read (cpp_ops/src/ort/op_table.generated.h).
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "check.h"
#include "kernels/half.h"
#include "kernels/op_error.h"
#include "ort/op_table.generated.h"

namespace gpu_check {

namespace table = tfops::ort::op_table;

// ------------------------------------------------------------------------------------------------ tensors

std::size_t SizeOf(DType t) {
  switch (t) {
    case DType::kF64:
      return 8;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kBool:
      return 1;
    default:
      return 4;
  }
}

const char* Name(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kF64:
      return "float64";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kI32:
      return "int32";
    case DType::kBool:
      return "bool";
  }
  return "?";
}

DType ParseDType(const std::string& name) {
  for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI32, DType::kBool}) {
    if (name == Name(t)) return t;
  }
  throw std::runtime_error("unknown dtype " + name);
}

bool IsFloat(DType t) { return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 || t == DType::kBF16; }

Tensor Tensor::Make(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.store.assign((t.nbytes() + 7) / 8 + 1, 0);  // one spare word: data() is never null
  return t;
}

int64_t Tensor::count() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

double Tensor::At(int64_t i) const {
  switch (dtype) {
    case DType::kF32:
      return as<float>()[i];
    case DType::kF64:
      return as<double>()[i];
    case DType::kF16:
      return tfops::HalfToFloat(as<uint16_t>()[i]);
    case DType::kBF16:
      return tfops::BFloat16ToFloat(as<uint16_t>()[i]);
    case DType::kI32:
      return as<int32_t>()[i];
    case DType::kBool:
      return as<uint8_t>()[i];
  }
  return 0;
}

uint64_t Tensor::BitsAt(int64_t i) const {
  switch (SizeOf(dtype)) {
    case 8:
      return as<uint64_t>()[i];
    case 4:
      return as<uint32_t>()[i];
    case 2:
      return as<uint16_t>()[i];
    default:
      return as<uint8_t>()[i];
  }
}

void Tensor::FillBytes(unsigned char byte) { std::memset(store.data(), byte, nbytes()); }

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + ")";
}

// ---------------------------------------------------------------------------------------------- op table

namespace {

const table::OpEntry& Entry(const std::string& op) {
  for (const table::OpEntry& e : table::kOps) {
    if (op == e.name) return e;
  }
  throw std::runtime_error("op " + op + " is not in the op table");
}

const table::AttrSpec& Spec(const std::string& op, const char* name) {
  const table::OpEntry& e = Entry(op);
  for (const table::AttrSpec& a : e.attrs) {
    if (std::strcmp(a.name, name) == 0) return a;
  }
  throw std::runtime_error("op " + op + " has no attribute " + name);
}

DType FromOnnx(ONNXTensorElementDataType t) {
  switch (t) {
    case table::kF32:
      return DType::kF32;
    case table::kF64:
      return DType::kF64;
    case table::kF16:
      return DType::kF16;
    case table::kBF16:
      return DType::kBF16;
    case table::kI32:
      return DType::kI32;
    default:
      throw std::runtime_error("op table type without a dtype here");
  }
}

}  // namespace

std::vector<std::string> AllOps() {
  std::vector<std::string> ops;
  for (const table::OpEntry& e : table::kOps) ops.push_back(e.name);
  return ops;
}

std::vector<std::vector<DType>> InputTypeCombinations(const std::string& op) {
  const table::OpEntry& e = Entry(op);
  std::vector<std::vector<DType>> out;
  const std::size_t width = e.input_count + e.output_count;
  for (std::size_t k = 0; k < e.combinations(); ++k) {
    std::vector<DType> types;
    for (std::size_t i = 0; i < e.input_count; ++i) types.push_back(FromOnnx(e.types.data[k * width + i]));
    out.push_back(types);
  }
  return out;
}

std::vector<std::string> LayoutChoices(const std::string& op) {
  for (const table::AttrSpec& a : Entry(op).attrs) {
    if (std::strcmp(a.name, "data_format") == 0) return {a.choices.begin(), a.choices.end()};
  }
  return {};
}

// ---------------------------------------------------------------------------------------------- attributes

int64_t Case::Int(const char* name) const {
  const table::AttrSpec& spec = Spec(op, name);
  auto it = attrs.find(name);
  if (it == attrs.end()) {
    if (spec.required) throw tfops::OpError(std::string("missing required attribute ") + name);
    return spec.int_default;
  }
  if (it->second.kind != 'i') throw tfops::OpError(std::string("attribute ") + name + " is not an integer");
  return it->second.i;
}

float Case::Float(const char* name) const {
  const table::AttrSpec& spec = Spec(op, name);
  auto it = attrs.find(name);
  if (it == attrs.end()) {
    if (spec.required) throw tfops::OpError(std::string("missing required attribute ") + name);
    return spec.float_default;
  }
  if (it->second.kind == 'i') return static_cast<float>(it->second.i);
  if (it->second.kind != 'f') throw tfops::OpError(std::string("attribute ") + name + " is not a float");
  return static_cast<float>(it->second.f);  // as ORT reads a float attribute: float32
}

std::string Case::String(const char* name) const {
  const table::AttrSpec& spec = Spec(op, name);
  auto it = attrs.find(name);
  std::string value;
  if (it == attrs.end()) {
    if (spec.required) throw tfops::OpError(std::string("missing required attribute ") + name);
    value = spec.string_default;
  } else {
    if (it->second.kind != 's') throw tfops::OpError(std::string("attribute ") + name + " is not a string");
    value = it->second.s;
  }
  if (spec.choices.size) {
    bool allowed = false;
    for (const char* choice : spec.choices) allowed = allowed || value == choice;
    if (!allowed) throw tfops::OpError(std::string("attribute ") + name + " has an unsupported value " + value);
  }
  return value;
}

std::vector<int64_t> Case::Ints(const char* name) const {
  const table::AttrSpec& spec = Spec(op, name);
  auto it = attrs.find(name);
  if (it == attrs.end()) {
    if (spec.required) throw tfops::OpError(std::string("missing required attribute ") + name);
    return {spec.ints_default.begin(), spec.ints_default.end()};
  }
  if (it->second.kind != 'l') throw tfops::OpError(std::string("attribute ") + name + " is not a list of ints");
  return it->second.l;
}

std::string Case::Layout() const {
  if (LayoutChoices(op).empty()) return "";
  try {
    return String("data_format");
  } catch (const tfops::OpError&) {
    return "?";
  }
}

DType Case::KeyType() const {
  for (const Tensor& t : inputs) {
    if (IsFloat(t.dtype) && t.dtype != DType::kF32) return t.dtype;
  }
  return DType::kF32;  // every op's float inputs are float32 unless T is another type
}

// ------------------------------------------------------------------------------------------------- reading

namespace {

class Reader {
 public:
  Reader(const std::string& path) : path_(path), in_(path, std::ios::binary) {
    if (!in_) throw std::runtime_error("cannot open " + path);
  }
  std::string Word() {
    std::string w;
    if (!(in_ >> w)) Fail("unexpected end of file");
    return w;
  }
  void Expect(const char* word) {
    const std::string w = Word();
    if (w != word) Fail(std::string("expected '") + word + "', got '" + w + "'");
  }
  int64_t Integer() {
    const std::string w = Word();
    char* end = nullptr;
    const long long v = std::strtoll(w.c_str(), &end, 10);
    if (*end != '\0') Fail("not an integer: " + w);
    return v;
  }
  double Real() {
    const std::string w = Word();
    char* end = nullptr;
    const double v = std::strtod(w.c_str(), &end);  // hex floats, inf and nan included
    if (*end != '\0') Fail("not a number: " + w);
    return v;
  }
  // n raw bytes after the newline that ends the current line, then that line's own newline.
  void Bytes(void* dst, std::size_t n) {
    if (in_.get() != '\n') Fail("expected a newline before raw bytes");
    if (n && !in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n))) Fail("truncated raw bytes");
    if (in_.get() != '\n') Fail("expected a newline after raw bytes");
  }
  std::string Text() {
    const int64_t n = Integer();
    std::string s(static_cast<std::size_t>(n), '\0');
    Bytes(s.data(), s.size());
    return s;
  }
  Tensor ReadTensor() {
    Expect("t");
    const DType dtype = ParseDType(Word());
    const int64_t rank = Integer();
    std::vector<int64_t> shape;
    for (int64_t i = 0; i < rank; ++i) shape.push_back(Integer());
    Tensor t = Tensor::Make(dtype, shape);
    const int64_t nbytes = Integer();
    if (static_cast<std::size_t>(nbytes) != t.nbytes()) Fail("tensor byte count does not match its shape");
    Bytes(t.data(), t.nbytes());
    return t;
  }
  [[noreturn]] void Fail(const std::string& why) {
    throw std::runtime_error(path_ + ": " + why + " (at byte " + std::to_string(static_cast<long long>(in_.tellg())) +
                             ")");
  }

 private:
  std::string path_;
  std::ifstream in_;
};

std::vector<Case> ReadFile(const std::string& path, const std::string& op) {
  Reader r(path);
  if (r.Word() != "TFOPS-GPU-CHECK-CASES" || r.Integer() != 1) r.Fail("not a version-1 case file");
  r.Expect("op");
  if (r.Word() != op) r.Fail("names another op");
  const int64_t count = r.Integer();
  std::vector<Case> cases;
  for (int64_t k = 0; k < count; ++k) {
    Case c;
    c.op = op;
    c.source = "golden";
    r.Expect("case");
    c.index = static_cast<int>(r.Integer());
    r.Expect("note");
    c.note = r.Text();
    r.Expect("attrs");
    const int64_t n_attrs = r.Integer();
    for (int64_t a = 0; a < n_attrs; ++a) {
      r.Expect("a");
      const std::string name = r.Word();
      AttrValue v;
      const std::string kind = r.Word();
      v.kind = kind.empty() ? '?' : kind[0];
      if (kind == "i") {
        v.i = r.Integer();
      } else if (kind == "f") {
        v.f = r.Real();
      } else if (kind == "s") {
        v.s = r.Text();
      } else if (kind == "l") {
        const int64_t n = r.Integer();
        for (int64_t i = 0; i < n; ++i) v.l.push_back(r.Integer());
      } else {
        r.Fail("unknown attribute kind " + kind);
      }
      c.attrs[name] = v;
    }
    r.Expect("error");
    c.error = r.Text();
    r.Expect("inputs");
    const int64_t n_in = r.Integer();
    for (int64_t i = 0; i < n_in; ++i) c.inputs.push_back(r.ReadTensor());
    r.Expect("outputs");
    const int64_t n_out = r.Integer();
    for (int64_t i = 0; i < n_out; ++i) c.expected.push_back(r.ReadTensor());
    c.has_expected = c.error.empty();
    r.Expect("end");
    cases.push_back(std::move(c));
  }
  return cases;
}

}  // namespace

std::vector<Case> ReadGoldenCases(const std::string& dir, std::vector<std::string>* missing_ops) {
  std::vector<Case> all;
  for (const std::string& op : AllOps()) {
    const std::string path = dir + "/" + op + ".cases";
    if (!std::ifstream(path)) {
      if (missing_ops) missing_ops->push_back(op);
      continue;
    }
    for (Case& c : ReadFile(path, op)) all.push_back(std::move(c));
  }
  return all;
}

}  // namespace gpu_check
