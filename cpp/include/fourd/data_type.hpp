// Element types and reduction operators understood by fourd.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fourd {

/// Element type of a buffer. The numeric values are stable: they cross the Python binding.
enum class DataType : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
};

/// Number of data types (for tables indexed by DataType).
inline constexpr int kNumDataTypes = 8;

/// Size in bytes of one element of `t`; 0 for a value outside the enum. Defined here (not in the
/// library) so that code linking no core library, such as the CUDA kernels, shares it.
constexpr size_t dataTypeSize(DataType t) noexcept {
  switch (t) {
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat64:
      return 8;
    case DataType::kFloat16:
      return 2;
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt8:
      return 1;
    case DataType::kUInt8:
      return 1;
    case DataType::kInt32:
      return 4;
    case DataType::kInt64:
      return 8;
  }
  return 0;
}

/// Canonical name ("float32", "bfloat16", ...). Throws InvalidArgument for an unknown value.
std::string toString(DataType t);

/// Parses a canonical name or a common alias ("float", "half", "bf16", "int", ...).
/// Throws InvalidArgument naming `argName` when the name is unknown.
DataType parseDataType(const std::string& name, const char* argName = "dtype");

/// True for float32, float64, float16 and bfloat16.
constexpr bool isFloating(DataType t) noexcept {
  return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kFloat16 ||
         t == DataType::kBFloat16;
}

/// Reduction operator. The numeric values are stable: they cross the Python binding.
enum class ReduceOp : int {
  kSum = 0,
  kProd = 1,
  kMin = 2,
  kMax = 3,
  kAvg = 4,  ///< sum divided by the group size; floating types only
};

inline constexpr int kNumReduceOps = 5;

/// Canonical name ("sum", "prod", "min", "max", "avg").
std::string toString(ReduceOp op);

/// Parses "sum", "prod" (or "product"), "min", "max", "avg". Throws InvalidArgument.
ReduceOp parseReduceOp(const std::string& name, const char* argName = "op");

/// Throws InvalidArgument when `op` is not defined for `t` (avg on integer types).
void checkOpSupported(ReduceOp op, DataType t, const char* argName = "op");

namespace detail {

/// The canonical name of `t` (as toString), or nullptr for a value outside the enum. Never
/// throws and needs no core library: the CUDA kernels, their tests and benchmark name types
/// through it.
constexpr const char* dataTypeName(DataType t) noexcept {
  switch (t) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kFloat16:
      return "float16";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kInt8:
      return "int8";
    case DataType::kUInt8:
      return "uint8";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
  }
  return nullptr;
}

/// The canonical name of `op` (as toString), or nullptr for a value outside the enum.
constexpr const char* reduceOpName(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kAvg:
      return "avg";
  }
  return nullptr;
}

}  // namespace detail

}  // namespace fourd
