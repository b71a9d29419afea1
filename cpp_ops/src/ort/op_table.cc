// Queries on the generated op table (op_table.h).
#include "ort/op_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "ort/op_table.generated.h"

namespace tfops {
namespace ort {
namespace op_table {

const OpEntry* FindOp(const char* name) {
  for (const OpEntry& op : kOps) {
    if (std::strcmp(op.name, name) == 0) return &op;
  }
  return nullptr;
}

const AttrSpec* FindAttr(const OpEntry& op, const char* name) {
  for (const AttrSpec& attr : op.attrs) {
    if (std::strcmp(attr.name, name) == 0) return &attr;
  }
  return nullptr;
}

namespace {

using Types = std::vector<ONNXTensorElementDataType>;
// (op name, provider, input types then output types)
using Registration = std::tuple<std::string, std::string, Types>;

bool OnCpu(const OrtCustomOp* op) { return std::strcmp(op->GetExecutionProviderType(op), "CPUExecutionProvider") == 0; }

Registration Describe(const OrtCustomOp* op) {
  Types types;
  for (std::size_t i = 0; i < op->GetInputTypeCount(op); ++i) types.push_back(op->GetInputType(op, i));
  for (std::size_t i = 0; i < op->GetOutputTypeCount(op); ++i) types.push_back(op->GetOutputType(op, i));
  return {op->GetName(op), op->GetExecutionProviderType(op), types};
}

std::set<std::pair<std::string, Types>> TableCombinations() {
  std::set<std::pair<std::string, Types>> out;
  for (const OpEntry& op : kOps) {
    const std::size_t width = op.input_count + op.output_count;
    for (std::size_t k = 0; k < op.combinations(); ++k) {
      out.insert({op.name, Types(op.types.data + k * width, op.types.data + (k + 1) * width)});
    }
  }
  return out;
}

std::string TypeList(const Types& types) {
  std::string out;
  for (ONNXTensorElementDataType t : types) out += (out.empty() ? "" : ",") + std::to_string(static_cast<int>(t));
  return out;
}

std::string Quoted(const std::string& s) { return "\"" + s + "\""; }

std::string AttrJson(const AttrSpec& a) {
  static const char* const kKinds[] = {"float", "int", "bool", "string", "ints"};
  std::string out = "{\"name\":" + Quoted(a.name) + ",\"kind\":" + Quoted(kKinds[static_cast<int>(a.kind)]) +
                    ",\"required\":" + (a.required ? "true" : "false") + ",\"default\":";
  if (a.required) {
    out += "null";
  } else {
    switch (a.kind) {
      case AttrKind::kFloat: {
        if (std::isinf(a.float_default)) {  // JSON has no infinity: JavaScript's spelling, which Python's json reads
          out += a.float_default > 0 ? "Infinity" : "-Infinity";
          break;
        }
        char buffer[32];  // 9 significant digits: the float32 reads back exactly
        std::snprintf(buffer, sizeof(buffer), "%.9g", static_cast<double>(a.float_default));
        out += buffer;
        break;
      }
      case AttrKind::kInt: out += std::to_string(a.int_default); break;
      case AttrKind::kBool: out += a.int_default ? "true" : "false"; break;
      case AttrKind::kString: out += Quoted(a.string_default); break;
      case AttrKind::kInts: {
        out += "[";
        for (std::size_t i = 0; i < a.ints_default.size; ++i) out += (i ? "," : "") + std::to_string(a.ints_default.data[i]);
        out += "]";
        break;
      }
    }
  }
  out += ",\"choices\":[";
  for (std::size_t i = 0; i < a.choices.size; ++i) out += (i ? "," : "") + Quoted(a.choices.data[i]);
  return out + "]}";
}

}  // namespace

std::string CheckRegisteredOps(const std::vector<const OrtCustomOp*>& registered) {
  const auto table = TableCombinations();
  std::set<std::pair<std::string, Types>> cpu;
  for (const OrtCustomOp* op : registered) {
    auto [name, provider, types] = Describe(op);
    if (table.count({name, types}) == 0) {
      return provider + " op " + name + " with types [" + TypeList(types) + "] is not in the op table";
    }
    if (OnCpu(op)) cpu.insert({name, types});
  }
  for (const auto& [name, types] : table) {
    if (cpu.count({name, types}) == 0) {
      return "op table entry " + name + " with types [" + TypeList(types) + "] has no CPU kernel";
    }
  }
  return "";
}

std::string DescribeAsJson(const std::vector<const OrtCustomOp*>& registered) {
  std::string out = "{\"registered\":[";
  for (std::size_t i = 0; i < registered.size(); ++i) {
    auto [name, provider, types] = Describe(registered[i]);
    const OrtCustomOp* op = registered[i];
    out += std::string(i ? "," : "") + "{\"op\":" + Quoted(name) + ",\"provider\":" + Quoted(provider) +
           ",\"inputs\":[" + TypeList(Types(types.begin(), types.begin() + op->GetInputTypeCount(op))) +
           "],\"outputs\":[" + TypeList(Types(types.begin() + op->GetInputTypeCount(op), types.end())) + "]}";
  }
  out += "],\"attributes\":{";
  bool first_op = true;
  for (const OpEntry& op : kOps) {
    out += std::string(first_op ? "" : ",") + Quoted(op.name) + ":[";
    first_op = false;
    for (std::size_t i = 0; i < op.attrs.size; ++i) out += (i ? "," : "") + AttrJson(op.attrs.data[i]);
    out += "]";
  }
  return out + "}}";
}

}  // namespace op_table
}  // namespace ort
}  // namespace tfops
