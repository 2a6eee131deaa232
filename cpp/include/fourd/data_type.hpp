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

/// Size in bytes of one element of `t`.
size_t dataTypeSize(DataType t) noexcept;

/// Canonical name ("float32", "bfloat16", ...). Throws InvalidArgument for an unknown value.
std::string toString(DataType t);

/// Parses a canonical name or a common alias ("float", "half", "bf16", "int", ...).
/// Throws InvalidArgument naming `argName` when the name is unknown.
DataType parseDataType(const std::string& name, const char* argName = "dtype");

/// True for float32, float64, float16 and bfloat16.
bool isFloating(DataType t) noexcept;

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

}  // namespace fourd
