#include "fourd/data_type.hpp"

#include <algorithm>
#include <cctype>

#include "fourd/error.hpp"

namespace fourd {

std::string toString(DataType t) {
  if (const char* name = detail::dataTypeName(t)) return name;
  throw InvalidArgument("dtype: expected a fourd DataType, found the value " +
                        std::to_string(static_cast<int>(t)));
}

static std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

DataType parseDataType(const std::string& name, const char* argName) {
  const std::string n = lower(name);
  if (n == "float32" || n == "float" || n == "f32" || n == "fp32") return DataType::kFloat32;
  if (n == "float64" || n == "double" || n == "f64" || n == "fp64") return DataType::kFloat64;
  if (n == "float16" || n == "half" || n == "f16" || n == "fp16") return DataType::kFloat16;
  if (n == "bfloat16" || n == "bf16") return DataType::kBFloat16;
  if (n == "int8" || n == "char") return DataType::kInt8;
  if (n == "uint8" || n == "byte") return DataType::kUInt8;
  if (n == "int32" || n == "int") return DataType::kInt32;
  if (n == "int64" || n == "long") return DataType::kInt64;
  throw InvalidArgument(std::string(argName) +
                        ": expected one of float32, float64, float16, bfloat16, int8, uint8, "
                        "int32, int64; found '" +
                        name + "'");
}

std::string toString(ReduceOp op) {
  if (const char* name = detail::reduceOpName(op)) return name;
  throw InvalidArgument("op: expected a fourd ReduceOp, found the value " +
                        std::to_string(static_cast<int>(op)));
}

ReduceOp parseReduceOp(const std::string& name, const char* argName) {
  const std::string n = lower(name);
  if (n == "sum") return ReduceOp::kSum;
  if (n == "prod" || n == "product") return ReduceOp::kProd;
  if (n == "min") return ReduceOp::kMin;
  if (n == "max") return ReduceOp::kMax;
  if (n == "avg" || n == "mean") return ReduceOp::kAvg;
  throw InvalidArgument(std::string(argName) +
                        ": expected one of sum, prod, min, max, avg; found '" + name + "'");
}

void checkOpSupported(ReduceOp op, DataType t, const char* argName) {
  if (op == ReduceOp::kAvg && !isFloating(t)) {
    throw InvalidArgument(std::string(argName) +
                          ": 'avg' needs a floating dtype (float32, float64, float16, bfloat16); "
                          "found dtype " +
                          toString(t) + " (use 'sum' and divide yourself)");
  }
}

}  // namespace fourd
