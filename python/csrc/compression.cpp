// Codecs and compression policies as Python sees them (fourd.compression): parse and check a
// codec or a policy, run one codec over a buffer (tests, the benchmark's codec throughput), and
// the error bound of a compressed collective (docs/compression.md).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <vector>

#include "algorithms/schedule.hpp"
#include "bindings.hpp"
#include "fourd/error.hpp"
#include "internal/codec.hpp"
#include "internal/compression.hpp"

namespace py = pybind11;
using fourd::DataType;

namespace fourd_py {

namespace {

py::dict codecInfo(const std::string& text) {
  const auto c = fourd::detail::parseCodec(text);
  py::dict d;
  d["codec"] = c.none() ? py::object(py::none()) : py::object(py::str(c.text()));
  d["lossy"] = c.lossy();
  d["auto"] = c.kind == fourd::detail::CodecKind::kAuto;
  return d;
}

// Encodes `count` elements at `in` and decodes them into `out`; returns the encoded bytes and
// the seconds of each half (GIL released).
py::tuple roundTrip(const std::string& text, uintptr_t in, uintptr_t out, size_t count, int dtype) {
  const auto spec = fourd::detail::parseCodec(text);
  if (spec.none() || spec.kind == fourd::detail::CodecKind::kAuto)
    throw fourd::InvalidArgument("codec: expected a codec, found '" + text + "'");
  const auto t = static_cast<DataType>(dtype);
  fourd::detail::checkCodecDtype(spec, t, "codec");
  const auto codec = fourd::detail::makeCodec(spec, t);
  std::vector<char> enc(codec->maxEncodedBytes(count));
  size_t bytes = 0;
  double te = 0, td = 0;
  withoutGil([&] {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    bytes = codec->encode(reinterpret_cast<const void*>(in), count, enc.data());
    const auto t1 = Clock::now();
    codec->decode(enc.data(), bytes, count, reinterpret_cast<void*>(out));
    const auto t2 = Clock::now();
    te = std::chrono::duration<double>(t1 - t0).count();
    td = std::chrono::duration<double>(t2 - t1).count();
  });
  return py::make_tuple(bytes, te, td);
}

// The bound of a compressed ring: `chain` + 1 ranks, inputs of magnitude <= absmax.
double bound(const std::string& text, int dtype, int chain, double absmax, bool gatherAfter) {
  const auto spec = fourd::detail::parseCodec(text);
  if (spec.none()) return 0.0;
  const auto codec = fourd::detail::makeCodec(spec, static_cast<DataType>(dtype));
  return fourd::detail::composedBound(*codec, chain, absmax, gatherAfter);
}

}  // namespace

void register_compression(py::module_& m) {
  m.def("codec_info", &codecInfo, py::arg("codec"));
  m.def("codec_check", [](const std::string& text, int dtype) {
    fourd::detail::checkCodecDtype(fourd::detail::parseCodec(text), static_cast<DataType>(dtype));
  });
  m.def("codec_round_trip", &roundTrip, py::arg("codec"), py::arg("src"), py::arg("dst"),
        py::arg("count"), py::arg("dtype"));
  m.def("codec_bound", &bound, py::arg("codec"), py::arg("dtype"), py::arg("chain"),
        py::arg("absmax"), py::arg("gather_after"));
  m.def("codec_wire_bytes", &fourd::detail::messageBytesSent,
        "Bytes this process has sent in compressed messages (headers included).");
  m.def(
      "compression_policy",
      [](const std::string& text) { return fourd::detail::parsePolicy(text).text(); },
      py::arg("policy"));
  m.def(
      "policy_codec",
      [](const std::string& policy, const std::string& group) {
        const auto c = fourd::detail::policyCodec(fourd::detail::parsePolicy(policy), group);
        return c.none() ? py::object(py::none()) : py::object(py::str(c.text()));
      },
      py::arg("policy"), py::arg("group"));
}

}  // namespace fourd_py
