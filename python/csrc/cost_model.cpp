// Bindings of the cost model (cost_model.hpp): MachineProfile, GroupShape, Prediction and
// predict / candidates / choose / is_supported. Collectives, algorithms and dtypes cross as
// their names ("all_gather", "hierarchical", "bfloat16"); C++ camelCase becomes snake_case.
// The planner (python -m fourd.plan) calls these, so `auto` and the planner share one model.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "fourd/cost_model.hpp"
#include "fourd/data_type.hpp"
#include "fourd/error.hpp"
#include "internal/reduce_kernels.hpp"

namespace py = pybind11;
using fourd::GroupShape;
using fourd::MachineProfile;
using fourd::Prediction;

namespace {

std::string profileRepr(const MachineProfile& p) {
  std::ostringstream os;
  os << "MachineProfile(name='" << p.name << "', ranks_per_node=" << p.ranksPerNode
     << ", intra_alpha=" << p.intraAlpha << ", intra_bw=" << p.intraBw
     << ", inter_alpha=" << p.interAlpha << ", nic_bw=" << p.nicBw
     << ", nics_per_node=" << p.nicsPerNode << ", reduce_bw=" << p.reduceBw
     << ", memcpy_bw=" << p.memcpyBw << ", flat_efficiency=" << p.flatEfficiency
     << ", flat_efficiency_16=" << p.flatEfficiency16
     << ", compute_flops=" << p.computeFlops << ", memory_bytes=" << p.memoryBytes
     << ", intra_mesh=" << (p.intraMesh ? "True" : "False")
     << ", hierarchical_chunks=" << p.hierarchicalChunks << ", shm_bw=" << p.shmBw
     << ", reduce_bw_16=" << p.reduceBw16 << ", shm_reduce_bw_16=" << p.shmReduceBw16
     << ", cache_bytes=" << p.cacheBytes
     << ", cache_bw_gain=" << p.cacheBwGain << ", corrections=<" << p.corrections.size()
     << " points>)";
  return os.str();
}

py::dict correctionToDict(const fourd::Correction& c) {
  py::dict d;
  d["collective"] = fourd::collectiveName(c.collective);
  d["algorithm"] = fourd::algorithmName(c.algorithm);
  d["group_size"] = c.groupSize;
  d["nodes"] = c.nodes;
  d["half16"] = c.half16;
  d["in_place"] = c.inPlace;
  d["nbytes"] = c.nbytes;
  d["factor"] = c.factor;
  return d;
}

/// A list of dicts with the keys of correctionToDict (all required).
std::vector<fourd::Correction> correctionsFrom(const py::object& seq) {
  std::vector<fourd::Correction> out;
  size_t i = 0;
  for (const py::handle item : seq) {
    const std::string at = "corrections[" + std::to_string(i++) + "]";
    if (!py::isinstance<py::dict>(item)) {
      throw fourd::InvalidArgument(at + ": expected a dict with collective, algorithm, "
                                   "group_size, nodes, half16, in_place, nbytes, factor");
    }
    const auto d = py::reinterpret_borrow<py::dict>(item);
    auto get = [&](const char* key) -> py::object {
      if (!d.contains(key)) throw fourd::InvalidArgument(at + ": missing key '" + key + "'");
      return d[key];
    };
    fourd::Correction c;
    c.collective = fourd::parseCollective(get("collective").cast<std::string>(),
                                          (at + ".collective").c_str());
    c.algorithm = fourd::parseAlgorithm(get("algorithm").cast<std::string>(),
                                        (at + ".algorithm").c_str());
    if (c.algorithm == fourd::Algorithm::kAuto) {
      throw fourd::InvalidArgument(at + ".algorithm: expected a concrete algorithm, found 'auto'");
    }
    c.groupSize = get("group_size").cast<int>();
    c.nodes = get("nodes").cast<int>();
    c.half16 = get("half16").cast<bool>();
    c.inPlace = get("in_place").cast<bool>();
    c.nbytes = get("nbytes").cast<double>();
    c.factor = get("factor").cast<double>();
    out.push_back(c);
  }
  return out;
}

py::list correctionsTo(const MachineProfile& p) {
  py::list out;
  for (const auto& c : p.corrections) out.append(correctionToDict(c));
  return out;
}

size_t checkedBytes(long long nbytes) {
  if (nbytes < 0) {
    throw fourd::InvalidArgument("nbytes: expected a byte count >= 0; found " +
                                 std::to_string(nbytes));
  }
  return static_cast<size_t>(nbytes);
}

/// Seconds (best of `reps`) of this build's sum kernel reducing `inputs` arrays of `nbytes`
/// each into one, as the collectives call it: the pairwise kernel of ring / rhd (inputs == 2,
/// many == false) or shm's k-input kernel (many == true). Calibration measures gamma with it.
double reduceKernelSeconds(const std::string& dtypeName, long long nbytes, int inputs, int reps,
                           bool many) {
  const fourd::DataType dtype = fourd::parseDataType(dtypeName, "dtype");
  const size_t es = fourd::dataTypeSize(dtype);
  const size_t bytes = checkedBytes(nbytes);
  if (inputs < 2 || reps < 1 || (!many && inputs != 2)) {
    throw fourd::InvalidArgument(
        "inputs, reps: expected reps >= 1 and inputs == 2 (pairwise) or >= 2 (many=True); "
        "found inputs=" + std::to_string(inputs) + ", reps=" + std::to_string(reps));
  }
  const size_t count = bytes / es;
  std::vector<std::vector<char>> in(static_cast<size_t>(inputs), std::vector<char>(count * es));
  std::vector<char> out(count * es);
  std::vector<const void*> srcs;
  for (const auto& v : in) srcs.push_back(v.data());
  auto once = [&] {
    if (!many) {
      fourd::detail::reduce2(out.data(), srcs[0], srcs[1], count, dtype, fourd::ReduceOp::kSum);
    } else {
      fourd::detail::reduceMany(out.data(), srcs.data(), inputs, count, dtype,
                                fourd::ReduceOp::kSum);
    }
  };
  once();  // warm: fault the pages, pick the kernel clone
  double best = 1e300;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    once();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                              .count());
  }
  return best;
}

}  // namespace

void register_cost_model(py::module_& m) {
  const MachineProfile d;  // defaults for the keyword constructor

  py::class_<MachineProfile>(m, "MachineProfile",
                             "Costs of one machine for the alpha-beta-gamma model. Seconds and "
                             "bytes per second (1e9 = 1 GB/s).")
      .def(py::init([](std::string name, int ranksPerNode, double intraAlpha, double intraBw,
                       double interAlpha, double nicBw, int nicsPerNode, double reduceBw,
                       double memcpyBw, double flatEfficiency, double computeFlops,
                       double memoryBytes, bool intraMesh, int hierarchicalChunks,
                       double shmBw, double reduceBw16, double shmReduceBw16,
                       double flatEfficiency16, double cacheBytes, double cacheBwGain,
                       const py::object& corrections) {
             MachineProfile p;
             p.name = std::move(name);
             p.ranksPerNode = ranksPerNode;
             p.intraAlpha = intraAlpha;
             p.intraBw = intraBw;
             p.interAlpha = interAlpha;
             p.nicBw = nicBw;
             p.nicsPerNode = nicsPerNode;
             p.reduceBw = reduceBw;
             p.memcpyBw = memcpyBw;
             p.flatEfficiency = flatEfficiency;
             p.computeFlops = computeFlops;
             p.memoryBytes = memoryBytes;
             p.intraMesh = intraMesh;
             p.hierarchicalChunks = hierarchicalChunks;
             p.shmBw = shmBw;
             p.reduceBw16 = reduceBw16;
             p.shmReduceBw16 = shmReduceBw16;
             p.flatEfficiency16 = flatEfficiency16;
             p.cacheBytes = cacheBytes;
             p.cacheBwGain = cacheBwGain;
             p.corrections = correctionsFrom(corrections);
             return p;
           }),
           py::kw_only(), py::arg("name") = d.name, py::arg("ranks_per_node") = d.ranksPerNode,
           py::arg("intra_alpha") = d.intraAlpha, py::arg("intra_bw") = d.intraBw,
           py::arg("inter_alpha") = d.interAlpha, py::arg("nic_bw") = d.nicBw,
           py::arg("nics_per_node") = d.nicsPerNode, py::arg("reduce_bw") = d.reduceBw,
           py::arg("memcpy_bw") = d.memcpyBw, py::arg("flat_efficiency") = d.flatEfficiency,
           py::arg("compute_flops") = d.computeFlops, py::arg("memory_bytes") = d.memoryBytes,
           py::arg("intra_mesh") = d.intraMesh,
           py::arg("hierarchical_chunks") = d.hierarchicalChunks, py::arg("shm_bw") = d.shmBw,
           py::arg("reduce_bw_16") = d.reduceBw16, py::arg("shm_reduce_bw_16") = d.shmReduceBw16,
           py::arg("flat_efficiency_16") = d.flatEfficiency16,
           py::arg("cache_bytes") = d.cacheBytes,
           py::arg("cache_bw_gain") = d.cacheBwGain, py::arg("corrections") = py::list())
      .def_readwrite("name", &MachineProfile::name)
      .def_readwrite("ranks_per_node", &MachineProfile::ranksPerNode)
      .def_readwrite("intra_alpha", &MachineProfile::intraAlpha)
      .def_readwrite("intra_bw", &MachineProfile::intraBw)
      .def_readwrite("inter_alpha", &MachineProfile::interAlpha)
      .def_readwrite("nic_bw", &MachineProfile::nicBw)
      .def_readwrite("nics_per_node", &MachineProfile::nicsPerNode)
      .def_readwrite("reduce_bw", &MachineProfile::reduceBw)
      .def_readwrite("memcpy_bw", &MachineProfile::memcpyBw)
      .def_readwrite("flat_efficiency", &MachineProfile::flatEfficiency)
      .def_readwrite("compute_flops", &MachineProfile::computeFlops)
      .def_readwrite("memory_bytes", &MachineProfile::memoryBytes)
      .def_readwrite("intra_mesh", &MachineProfile::intraMesh)
      .def_readwrite("hierarchical_chunks", &MachineProfile::hierarchicalChunks)
      .def_readwrite("shm_bw", &MachineProfile::shmBw)
      .def_readwrite("reduce_bw_16", &MachineProfile::reduceBw16)
      .def_readwrite("shm_reduce_bw_16", &MachineProfile::shmReduceBw16)
      .def_readwrite("flat_efficiency_16", &MachineProfile::flatEfficiency16)
      .def_readwrite("cache_bytes", &MachineProfile::cacheBytes)
      .def_readwrite("cache_bw_gain", &MachineProfile::cacheBwGain)
      .def_property(
          "corrections", &correctionsTo,
          [](MachineProfile& p, const py::object& seq) { p.corrections = correctionsFrom(seq); },
          "Measured corrections of the model: a list of dicts (collective, algorithm, "
          "group_size, nodes, half16, in_place, nbytes, factor = measured / predicted).")
      .def("node_injection_bw", &MachineProfile::nodeInjectionBw,
           "nic_bw * nics_per_node, bytes/s")
      .def("__repr__", &profileRepr);

  py::class_<GroupShape>(m, "GroupShape",
                         "How a group is placed: `size` ranks on `nodes` nodes, "
                         "`ranks_per_node` each when uniform.")
      .def(py::init([](int size, int nodes, int ranksPerNode, bool uniform) {
             return GroupShape{size, nodes, ranksPerNode, uniform};
           }),
           py::arg("size") = 1, py::arg("nodes") = 1, py::arg("ranks_per_node") = 1,
           py::arg("uniform") = true)
      .def_readwrite("size", &GroupShape::size)
      .def_readwrite("nodes", &GroupShape::nodes)
      .def_readwrite("ranks_per_node", &GroupShape::ranksPerNode)
      .def_readwrite("uniform", &GroupShape::uniform)
      .def("__repr__", [](const GroupShape& s) {
        return "GroupShape(size=" + std::to_string(s.size) + ", nodes=" +
               std::to_string(s.nodes) + ", ranks_per_node=" + std::to_string(s.ranksPerNode) +
               ", uniform=" + (s.uniform ? "True" : "False") + ")";
      });

  py::class_<Prediction>(m, "Prediction", "One candidate of a selection.")
      .def_property_readonly("algorithm",
                             [](const Prediction& p) { return fourd::algorithmName(p.algorithm); })
      .def_readonly("seconds", &Prediction::seconds)
      .def_readonly("correction", &Prediction::correction)
      .def_readonly("supported", &Prediction::supported)
      .def_readonly("reason", &Prediction::reason)
      .def("__repr__", [](const Prediction& p) {
        std::ostringstream os;
        os << "Prediction(algorithm='" << fourd::algorithmName(p.algorithm)
           << "', seconds=" << p.seconds << ", supported=" << (p.supported ? "True" : "False")
           << ", reason='" << p.reason << "')";
        return os.str();
      });

  m.def(
      "predict",
      [](const std::string& collective, const std::string& algorithm, long long nbytes,
         const std::string& dtype, const GroupShape& shape, const MachineProfile& profile,
         bool inPlace) {
        return fourd::predict(fourd::parseCollective(collective),
                              fourd::parseAlgorithm(algorithm), checkedBytes(nbytes),
                              fourd::parseDataType(dtype), shape, profile, inPlace);
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("nbytes"), py::arg("dtype"),
      py::arg("shape"), py::arg("profile"), py::arg("in_place") = false,
      "Predicted seconds of one collective; inf when the algorithm cannot run on the shape.");
  m.def(
      "candidates",
      [](const std::string& collective, long long nbytes, const std::string& dtype,
         const GroupShape& shape, const MachineProfile& profile, bool inPlace) {
        return fourd::candidates(fourd::parseCollective(collective), checkedBytes(nbytes),
                                 fourd::parseDataType(dtype), shape, profile, inPlace);
      },
      py::arg("collective"), py::arg("nbytes"), py::arg("dtype"), py::arg("shape"),
      py::arg("profile"), py::arg("in_place") = false, "Every concrete algorithm with its prediction, in enum order.");
  m.def(
      "choose",
      [](const std::string& collective, long long nbytes, const std::string& dtype,
         const GroupShape& shape, const MachineProfile& profile, bool inPlace) {
        return std::string(fourd::algorithmName(
            fourd::choose(fourd::parseCollective(collective), checkedBytes(nbytes),
                          fourd::parseDataType(dtype), shape, profile, inPlace)));
      },
      py::arg("collective"), py::arg("nbytes"), py::arg("dtype"), py::arg("shape"),
      py::arg("profile"), py::arg("in_place") = false, "The supported algorithm with the smallest prediction (never 'auto').");
  m.def("reduce_kernel_seconds", &reduceKernelSeconds, py::arg("dtype"), py::arg("nbytes"),
        py::arg("inputs") = 2, py::arg("reps") = 3, py::arg("many") = false,
        py::call_guard<py::gil_scoped_release>(),
        "Best-of-reps seconds of fourd's sum kernel over `inputs` arrays of `nbytes` each.");
  m.def("memory_time_scale", &fourd::memoryTimeScale, py::arg("profile"),
        py::arg("node_working_set_bytes"),
        "Time multiplier (0, 1] of the memory-bound terms when the node's ranks together touch "
        "this many bytes (1 without a cache tier).");
  m.def(
      "is_supported",
      [](const std::string& collective, const std::string& algorithm, const GroupShape& shape) {
        std::string reason;
        const bool ok = fourd::isSupported(fourd::parseCollective(collective),
                                           fourd::parseAlgorithm(algorithm), shape, &reason);
        return py::make_tuple(ok, reason);
      },
      py::arg("collective"), py::arg("algorithm"), py::arg("shape"),
      "(supported, reason) of an algorithm on a group shape.");
}
