// Codec names: parsing, the canonical spelling, the dtypes each codec takes, and makeCodec's
// dispatch to the family that implements it (blosc_codec.cpp, zfp_codec.cpp, int8_codec.cpp,
// bf16_codec.cpp). The grammar is in internal/codec.hpp; docs/compression.md lists each codec's
// format and error bound.
#include "internal/codec.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <string_view>
#include <system_error>

#include "fourd/error.hpp"

namespace fourd::detail {

namespace {

constexpr const char* kExpected =
    "expected one of none, lossless, lossless:lz4, lossless:zstd, zfp:reversible, zfp:rate=R, "
    "zfp:tol=T, int8, int8:block=B, bf16, auto";

std::string lowerTrimmed(const std::string& s) {
  auto notSpace = [](unsigned char c) { return !std::isspace(c); };
  auto b = std::find_if(s.begin(), s.end(), notSpace);
  auto e = std::find_if(s.rbegin(), s.rend(), notSpace).base();
  std::string out = b < e ? std::string(b, e) : std::string();
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

// The shortest decimal spelling that reads back as the same double.
std::string shortest(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// A whole-string decimal number; false for anything else ("", "8x", "0x10", " 8").
bool parseNumber(std::string_view s, double& out) {
  if (s.empty()) return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), out, std::chars_format::general);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

[[noreturn]] void fail(const char* argName, const std::string& what) {
  throw InvalidArgument(std::string(argName) + ": " + what);
}

std::string quoted(std::string_view s) { return "\"" + std::string(s) + "\""; }

double parseRate(std::string_view v, const char* argName) {
  double r;
  if (!parseNumber(v, r)) {
    fail(argName, "zfp rate must be a number of bits per value in (0, 64]; found " + quoted(v));
  }
  if (!(r > 0.0 && r <= 64.0)) {
    fail(argName, "zfp rate must be in (0, 64]; found " + std::string(v));
  }
  return r;
}

double parseTolerance(std::string_view v, const char* argName) {
  double t;
  if (!parseNumber(v, t) || !std::isfinite(t) || !(t > 0.0)) {
    fail(argName, "zfp tolerance must be a positive finite number; found " + quoted(v));
  }
  return t;
}

double parseBlock(std::string_view v, const char* argName) {
  long long b = 0;
  auto r = std::from_chars(v.data(), v.data() + v.size(), b);
  const bool whole = !v.empty() && r.ec == std::errc() && r.ptr == v.data() + v.size();
  if (!whole || b < 8 || b > 65536) {
    fail(argName, "int8 block must be an integer in [8, 65536]; found " + quoted(v));
  }
  return static_cast<double>(b);
}

CodecSpec parseZfp(std::string_view opt, const std::string& text, const char* argName) {
  CodecSpec s;
  if (opt == "reversible") {
    s.kind = CodecKind::kZfpReversible;
    return s;
  }
  const size_t eq = opt.find('=');
  const std::string_view key = opt.substr(0, eq);
  const std::string_view value = eq == std::string_view::npos ? "" : opt.substr(eq + 1);
  if (eq != std::string_view::npos && key == "rate") {
    s.kind = CodecKind::kZfpRate;
    s.param = parseRate(value, argName);
  } else if (eq != std::string_view::npos && (key == "tol" || key == "accuracy")) {
    s.kind = CodecKind::kZfpTol;
    s.param = parseTolerance(value, argName);
  } else {
    fail(argName,
         "zfp needs a mode: zfp:reversible, zfp:rate=R or zfp:tol=T; found " + quoted(text));
  }
  return s;
}

CodecSpec parseInt8(std::string_view opt, const std::string& text, const char* argName) {
  CodecSpec s;
  s.kind = CodecKind::kInt8;
  s.param = 256;
  if (opt.empty()) return s;
  if (opt.substr(0, 6) != "block=") {
    fail(argName, "unknown option " + quoted(opt) + " for int8; expected int8 or int8:block=B; " +
                      "found " + quoted(text));
  }
  s.param = parseBlock(opt.substr(6), argName);
  return s;
}

CodecSpec parseLossless(std::string_view opt, const std::string& text, const char* argName) {
  CodecSpec s;
  s.kind = CodecKind::kLossless;
  if (opt.empty() || opt == "lz4") {
    s.compressor = "lz4";
  } else if (opt == "zstd") {
    s.compressor = "zstd";
  } else {
    fail(argName, "unknown compressor " + quoted(opt) +
                      " for lossless; expected lossless, lossless:lz4 or lossless:zstd; found " +
                      quoted(text));
  }
  return s;
}

// A codec that takes no option ("none", "bf16", "auto").
CodecSpec parsePlain(CodecKind kind, std::string_view name, bool hasOpt, const std::string& text,
                     const char* argName) {
  if (hasOpt) {
    fail(argName,
         std::string(name) + " takes no option; found " + quoted(text) + " (" + kExpected + ")");
  }
  CodecSpec s;
  s.kind = kind;
  return s;
}

bool takes(const CodecSpec& spec, DataType t) {
  switch (spec.kind) {
    case CodecKind::kNone:
    case CodecKind::kLossless:
    case CodecKind::kAuto:
      return dataTypeSize(t) != 0;
    case CodecKind::kZfpReversible:
    case CodecKind::kZfpRate:
    case CodecKind::kZfpTol:
    case CodecKind::kBf16:
      return t == DataType::kFloat32 || t == DataType::kFloat64;
    case CodecKind::kInt8:
      return isFloating(t);
  }
  return false;
}

const char* dtypesTaken(CodecKind kind) {
  switch (kind) {
    case CodecKind::kZfpReversible:
    case CodecKind::kZfpRate:
    case CodecKind::kZfpTol:
    case CodecKind::kBf16:
      return "float32, float64";
    case CodecKind::kInt8:
      return "float32, float64, float16, bfloat16";
    default:
      return "any dtype";
  }
}

}  // namespace

bool CodecSpec::lossy() const noexcept {
  return kind == CodecKind::kZfpRate || kind == CodecKind::kZfpTol || kind == CodecKind::kInt8 ||
         kind == CodecKind::kBf16;
}

std::string CodecSpec::text() const {
  switch (kind) {
    case CodecKind::kNone:
      return "none";
    case CodecKind::kLossless:
      return "lossless:" + compressor;
    case CodecKind::kZfpReversible:
      return "zfp:reversible";
    case CodecKind::kZfpRate:
      return "zfp:rate=" + shortest(param);
    case CodecKind::kZfpTol:
      return "zfp:tol=" + shortest(param);
    case CodecKind::kInt8:
      return "int8:block=" + std::to_string(static_cast<long long>(param));
    case CodecKind::kBf16:
      return "bf16";
    case CodecKind::kAuto:
      return "auto";
  }
  return "none";
}

CodecSpec parseCodec(const std::string& text, const char* argName) {
  const std::string t = lowerTrimmed(text);
  const size_t colon = t.find(':');
  const std::string_view all(t);
  const std::string_view name = all.substr(0, colon);
  const bool hasOpt = colon != std::string::npos;
  const std::string_view opt = hasOpt ? all.substr(colon + 1) : std::string_view();
  if (hasOpt && opt.empty())
    fail(argName, "nothing after ':' in " + quoted(text) + "; " + kExpected);
  if (name == "lossless") return parseLossless(opt, text, argName);
  if (name == "int8") return parseInt8(opt, text, argName);
  if (name == "zfp") return parseZfp(opt, text, argName);
  if (name == "none") return parsePlain(CodecKind::kNone, name, hasOpt, text, argName);
  if (name == "bf16") return parsePlain(CodecKind::kBf16, name, hasOpt, text, argName);
  if (name == "auto") return parsePlain(CodecKind::kAuto, name, hasOpt, text, argName);
  fail(argName, "unknown codec " + quoted(text) + "; " + kExpected);
}

void checkCodecDtype(const CodecSpec& spec, DataType t, const char* argName) {
  if (takes(spec, t)) return;
  const char* name = dataTypeName(t);
  fail(argName, "codec " + quoted(spec.text()) + " does not take dtype " +
                    (name ? std::string(name) : std::to_string(static_cast<int>(t))) +
                    "; it takes " + dtypesTaken(spec.kind));
}

std::unique_ptr<Codec> makeCodec(const CodecSpec& spec, DataType t) {
  // A spec built by hand rather than parsed is held to the same rules (a rate in (0, 64], a
  // block in [8, 65536], a known compressor): its canonical text must parse.
  parseCodec(spec.text(), "compression");
  checkCodecDtype(spec, t, "compression");
  switch (spec.kind) {
    case CodecKind::kLossless:
      return makeLosslessCodec(spec, t);
    case CodecKind::kZfpReversible:
    case CodecKind::kZfpRate:
    case CodecKind::kZfpTol:
      return makeZfpCodec(spec, t);
    case CodecKind::kInt8:
      return makeInt8Codec(spec, t);
    case CodecKind::kBf16:
      return makeBf16Codec(spec, t);
    case CodecKind::kNone:
    case CodecKind::kAuto:
      break;
  }
  fail("compression", "makeCodec needs a codec, not " + quoted(spec.text()) +
                          " (none and auto are resolved by the communicator)");
}

}  // namespace fourd::detail
