// Typed errors thrown by fourd. The Python binding maps each to a Python class:
//   InvalidArgument -> fourd.InvalidArgumentError (a ValueError)
//   TypeMismatch    -> fourd.DTypeError (a TypeError)
//   BackendError    -> fourd.BackendError
//   TimeoutError    -> fourd.TimeoutError (a builtin TimeoutError)
//   AbortedError    -> fourd.AbortedError
//   MismatchError   -> fourd.MismatchError (ranks called different collectives)
// and every class derives from fourd.Error (a RuntimeError).
#pragma once

#include <stdexcept>
#include <string>

namespace fourd {

/// Base class of every error fourd throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// A bad argument detected before any communication. The message names the argument,
/// what was expected and what was found.
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& what) : Error(what) {}
};

/// A dtype that does not fit the call (mismatched input/output dtypes, unsupported type).
class TypeMismatch : public Error {
 public:
  explicit TypeMismatch(const std::string& what) : Error(what) {}
};

/// The MPI or NCCL library reported an error; `code()` is the library's code.
class BackendError : public Error {
 public:
  BackendError(const std::string& what, int code) : Error(what), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

/// A wait passed its deadline. The communicator that timed out is poisoned.
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what) : Error(what) {}
};

/// The communicator was poisoned by an earlier timeout, interrupt or failure, or the
/// operation was interrupted (Ctrl-C). Later calls on it fail at once.
class AbortedError : public Error {
 public:
  explicit AbortedError(const std::string& what) : Error(what) {}
};

/// The ranks of a group disagree: different grid arguments at init, or (with FOURD_DEBUG=1)
/// different collectives, counts or dtypes. Raised on every rank of the group.
class MismatchError : public Error {
 public:
  explicit MismatchError(const std::string& what) : Error(what) {}
};

}  // namespace fourd
