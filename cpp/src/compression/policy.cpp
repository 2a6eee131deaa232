// The compression policy of a grid: parsing, presets, and which entry applies to a group
// (internal/compression.hpp).
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>

#include "fourd/error.hpp"
#include "internal/compression.hpp"

namespace fourd::detail {

namespace {

std::string trimmed(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, sep)) out.push_back(trimmed(cur));
  if (!s.empty() && s.back() == sep) out.push_back("");
  return out;
}

bool isAxis(const std::string& a) { return a == "x" || a == "y" || a == "z" || a == "data"; }

// The paper's presets (Xu et al., arXiv 2409.02423): MZHybrid, lossless on the model-parallel
// axes and error-bounded ZFP on data-parallel gradients; ZHybrid, ZFP on every axis with the
// model-parallel traffic at a higher rate.
std::string preset(const std::string& lower) {
  if (lower == "mzhybrid") return "data=zfp:rate=8;x,y,z=lossless";
  if (lower == "zhybrid") return "data=zfp:rate=8;x,y,z=zfp:rate=16";
  return lower;
}

// One "axes=codec" entry; a bare codec (its first '=' is inside the codec's options, or it has
// none) applies to every axis.
std::pair<std::vector<std::string>, CodecSpec> parseEntry(const std::string& entry,
                                                          const char* argName) {
  const size_t eq = entry.find('=');
  const size_t colon = entry.find(':');
  if (eq != std::string::npos && (colon == std::string::npos || eq < colon)) {
    std::vector<std::string> axes = split(entry.substr(0, eq), ',');
    for (const auto& a : axes) {
      if (!isAxis(a)) {
        throw InvalidArgument(std::string(argName) +
                              ": expected axes among x, y, z, data before '=' in '" + entry +
                              "', found '" + a + "'");
      }
    }
    CodecSpec c = parseCodec(entry.substr(eq + 1), argName);
    return {axes, c};
  }
  return {{}, parseCodec(entry, argName)};
}

}  // namespace

CompressionPolicy parsePolicy(const std::string& text, const char* argName) {
  CompressionPolicy p;
  std::string lower = trimmed(text);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  lower = preset(lower);
  if (lower.empty() || lower == "none") return p;
  for (const std::string& e : split(lower, ';')) {
    if (e.empty()) {
      throw InvalidArgument(std::string(argName) + ": empty entry in the policy '" + text +
                            "' (entries are 'axes=codec' separated by ';')");
    }
    auto entry = parseEntry(e, argName);
    if (!entry.second.none() || !entry.first.empty()) p.entries.push_back(std::move(entry));
  }
  return p;
}

std::string CompressionPolicy::text() const {
  std::string out;
  for (const auto& [axes, codec] : entries) {
    if (!out.empty()) out += ";";
    for (size_t i = 0; i < axes.size(); ++i) out += (i ? "," : "") + axes[i];
    if (!axes.empty()) out += "=";
    out += codec.text();
  }
  return out;
}

CodecSpec policyCodec(const CompressionPolicy& policy, const std::string& groupName) {
  std::vector<std::string> mine = split(groupName, '+');
  if (groupName == "world") mine = {"x", "y", "z", "data"};
  for (const auto& [axes, codec] : policy.entries) {
    const bool all = std::all_of(mine.begin(), mine.end(), [&](const std::string& a) {
      return axes.empty() || std::find(axes.begin(), axes.end(), a) != axes.end();
    });
    if (all) return codec;
  }
  return CodecSpec{};
}

std::string effectivePolicyText(const std::string& configured) {
  const char* e = std::getenv("FOURD_COMPRESSION");
  if (e && *e) return e;
  return configured;
}

}  // namespace fourd::detail
