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
#include <type_traits>
#include <utility>
#include <variant>
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
      throw fourd::InvalidArgument(at +
                                   ": expected a dict with collective, algorithm, "
                                   "group_size, nodes, half16, in_place, nbytes, factor");
    }
    const auto d = py::reinterpret_borrow<py::dict>(item);
    auto get = [&](const char* key) -> py::object {
      if (!d.contains(key)) throw fourd::InvalidArgument(at + ": missing key '" + key + "'");
      return d[key];
    };
    fourd::Correction c;
    c.collective =
        fourd::parseCollective(get("collective").cast<std::string>(), (at + ".collective").c_str());
    c.algorithm =
        fourd::parseAlgorithm(get("algorithm").cast<std::string>(), (at + ".algorithm").c_str());
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
        "found inputs=" +
        std::to_string(inputs) + ", reps=" + std::to_string(reps));
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
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Reads field `f` of `p` as a Python object.
py::object getField(const MachineProfile& p, const fourd::ProfileField& f) {
  return std::visit(
      [&](auto member) -> py::object {
        using T = std::decay_t<decltype(p.*member)>;
        if constexpr (std::is_same_v<T, std::vector<fourd::Correction>>) {
          return correctionsTo(p);
        } else {
          return py::cast(p.*member);
        }
      },
      f.member);
}

// Sets field `f` of `p` from a Python object; InvalidArgument names the field on a bad value.
void setField(MachineProfile& p, const fourd::ProfileField& f, const py::handle& v) {
  std::visit(
      [&](auto member) {
        using T = std::decay_t<decltype(p.*member)>;
        if constexpr (std::is_same_v<T, std::vector<fourd::Correction>>) {
          p.*member = correctionsFrom(py::reinterpret_borrow<py::object>(v));
        } else {
          const bool numberForString =
              std::is_same_v<T, std::string> && !py::isinstance<py::str>(v);
          const bool badBool = std::is_same_v<T, bool> && !py::isinstance<py::bool_>(v) &&
                               !py::isinstance<py::int_>(v);
          const bool stringForNumber =
              !std::is_same_v<T, std::string> && py::isinstance<py::str>(v);
          if (numberForString || badBool || stringForNumber) {
            throw fourd::InvalidArgument(std::string("profile.") + f.name + ": expected " +
                                         (std::is_same_v<T, std::string> ? "a string"
                                          : std::is_same_v<T, bool>      ? "a bool"
                                                                         : "a number") +
                                         ", found " + py::repr(v).cast<std::string>());
          }
          try {
            p.*member = v.cast<T>();
          } catch (const py::cast_error&) {
            throw fourd::InvalidArgument(std::string("profile.") + f.name + ": cannot use " +
                                         py::repr(v).cast<std::string>());
          }
        }
      },
      f.member);
}

const fourd::ProfileField& fieldNamed(const std::string& name) {
  for (const auto& f : fourd::profileFields())
    if (name == f.name) return f;
  std::string known;
  for (const auto& f : fourd::profileFields())
    known += std::string(known.empty() ? "" : ", ") + f.name;
  throw fourd::InvalidArgument("profile: unknown field '" + name + "'; expected one of " + known);
}

std::string profileRepr(const MachineProfile& p) {
  std::ostringstream os;
  os << "MachineProfile(";
  bool first = true;
  for (const auto& f : fourd::profileFields()) {
    os << (first ? "" : ", ") << f.name << "=";
    first = false;
    if (std::holds_alternative<std::vector<fourd::Correction> MachineProfile::*>(f.member)) {
      os << "<" << p.corrections.size() << " points>";
    } else {
      os << py::repr(getField(p, f)).cast<std::string>();
    }
  }
  os << ")";
  return os.str();
}

// MachineProfile, its properties and constructor made from fourd::profileFields().
void bindProfile(py::module_& m) {
  auto cls = py::class_<MachineProfile>(
      m, "MachineProfile",
      "Costs of one machine for the alpha-beta-gamma model. Seconds and bytes per second "
      "(1e9 = 1 GB/s). MachineProfile(**fields); FIELDS lists the fields.");
  cls.def(py::init([](const py::kwargs& kw) {
            MachineProfile p;
            for (auto item : kw) setField(p, fieldNamed(py::str(item.first)), item.second);
            return p;
          }),
          "A profile with the defaults, and the keyword fields given set.");
  py::list names;
  for (const auto& f : fourd::profileFields()) {
    names.append(f.name);
    const fourd::ProfileField* fp = &f;
    cls.def_property(
        f.name, [fp](const MachineProfile& p) { return getField(p, *fp); },
        [fp](MachineProfile& p, const py::object& v) { setField(p, *fp, v); }, f.doc);
  }
  cls.attr("FIELDS") = py::tuple(names);
  cls.def(
      "to_dict",
      [](const MachineProfile& p) {
        py::dict d;
        for (const auto& f : fourd::profileFields()) d[f.name] = getField(p, f);
        return d;
      },
      "Every field as a plain dict (corrections as a list of dicts).");
  cls.def("check", &fourd::checkProfile,
          "Raises InvalidArgumentError naming the first field out of its range.");
  cls.def("node_injection_bw", &MachineProfile::nodeInjectionBw, "nic_bw * nics_per_node, B/s");
  cls.def("__repr__", &profileRepr);
  cls.def(py::pickle(
      [](const MachineProfile& p) {
        py::dict d;
        for (const auto& f : fourd::profileFields()) d[f.name] = getField(p, f);
        return d;
      },
      [](const py::dict& d) {
        MachineProfile p;
        for (auto item : d) setField(p, fieldNamed(py::str(item.first)), item.second);
        return p;
      }));
}

}  // namespace

static void bindModelTypes(py::module_& m) {
  bindProfile(m);

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
        return "GroupShape(size=" + std::to_string(s.size) + ", nodes=" + std::to_string(s.nodes) +
               ", ranks_per_node=" + std::to_string(s.ranksPerNode) +
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
}

// The model's functions: what auto and the planner both call.
static void bindModelFunctions(py::module_& m) {
  m.def(
      "predict",
      [](const std::string& collective, const std::string& algorithm, long long nbytes,
         const std::string& dtype, const GroupShape& shape, const MachineProfile& profile,
         bool inPlace) {
        return fourd::predict(fourd::parseCollective(collective), fourd::parseAlgorithm(algorithm),
                              checkedBytes(nbytes), fourd::parseDataType(dtype), shape, profile,
                              inPlace);
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
      py::arg("profile"), py::arg("in_place") = false,
      "Every concrete algorithm with its prediction, in enum order.");
  m.def(
      "choose",
      [](const std::string& collective, long long nbytes, const std::string& dtype,
         const GroupShape& shape, const MachineProfile& profile, bool inPlace) {
        return std::string(fourd::algorithmName(
            fourd::choose(fourd::parseCollective(collective), checkedBytes(nbytes),
                          fourd::parseDataType(dtype), shape, profile, inPlace)));
      },
      py::arg("collective"), py::arg("nbytes"), py::arg("dtype"), py::arg("shape"),
      py::arg("profile"), py::arg("in_place") = false,
      "The supported algorithm with the smallest prediction (never 'auto').");
  m.def(
      "reduce_kernel_seconds",
      [](const std::string& dtype, long long nbytes, int inputs, int reps, bool many) {
        return fourd_py::withoutGil(
            [&] { return reduceKernelSeconds(dtype, nbytes, inputs, reps, many); });
      },
      py::arg("dtype"), py::arg("nbytes"), py::arg("inputs") = 2, py::arg("reps") = 3,
      py::arg("many") = false,
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

void register_cost_model(py::module_& m) {
  bindModelTypes(m);
  bindModelFunctions(m);
}
