#include "fourd/data_type.hpp"

#include <algorithm>
#include <cctype>

#include "fourd/error.hpp"

namespace fourd {

size_t dataTypeSize(DataType t) noexcept {
  switch (t) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kInt8: return 1;
    case DataType::kUInt8: return 1;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
  }
  return 0;
}

std::string toString(DataType t) {
  switch (t) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kInt8: return "int8";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
  }
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
  if (n == "int8") return DataType::kInt8;
  if (n == "uint8" || n == "byte") return DataType::kUInt8;
  if (n == "int32" || n == "int") return DataType::kInt32;
  if (n == "int64" || n == "long") return DataType::kInt64;
  throw InvalidArgument(std::string(argName) +
                        ": expected one of float32, float64, float16, bfloat16, int8, uint8, "
                        "int32, int64; found '" + name + "'");
}

bool isFloating(DataType t) noexcept {
  return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kFloat16 ||
         t == DataType::kBFloat16;
}

std::string toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kAvg: return "avg";
  }
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
                          "found dtype " + toString(t) + " (use 'sum' and divide yourself)");
  }
}

}  // namespace fourd
