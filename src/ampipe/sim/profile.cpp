#include "ampipe/sim/profile.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ampipe/core/json.h"
#include "ampipe/core/error.h"
#include "ampipe/core/safetensors.h"

namespace ampipe::sim {

namespace {

using json = nlohmann::json;

const std::string kIntra = "intra", kInter = "inter";

// Reads the fields of one profile, naming `where` and the dotted field in every error.
struct Reader {
  std::string where;

  [[noreturn]] void fail(const std::string& field, const std::string& problem) const {
    throw ConfigError(fmt::format("{}: field {} {}", where, field, problem));
  }

  static std::string shown(const json& v) {
    if (v.is_number()) return fmt::format("{}", v.get<double>());
    std::string s = v.dump();
    if (s.size() > 40) s = s.substr(0, 37) + "...";
    return s;
  }

  const json& object(const json& parent, const std::string& key, const std::string& field) const {
    auto it = parent.find(key);
    if (it == parent.end()) fail(field, "is missing");
    if (!it->is_object()) fail(field, fmt::format("is {}: it must be an object", shown(*it)));
    return *it;
  }

  // A required number > 0 (allow_zero: >= 0).
  double number(const json& parent, const std::string& key, const std::string& prefix, bool allow_zero = false) const {
    const std::string field = prefix.empty() ? key : prefix + "." + key;
    auto it = parent.find(key);
    if (it == parent.end()) fail(field, "is missing");
    return check(*it, field, allow_zero);
  }

  double check(const json& v, const std::string& field, bool allow_zero) const {
    const char* rule = allow_zero ? "it must be a number >= 0" : "it must be a positive number";
    if (!v.is_number()) fail(field, fmt::format("is {}: {}", shown(v), rule));
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < 0 || (x == 0 && !allow_zero)) fail(field, fmt::format("is {}: {}", shown(v), rule));
    return x;
  }

  ComputeRates rates(const json& o, const std::string& field) const {
    ComputeRates r;
    r.gemm_peak_tflops = number(o, "gemm_peak_tflops", field);
    r.gemm_half_rate_dim = number(o, "gemm_half_rate_dim", field);
    r.attention_fwd_tflops = number(o, "attention_fwd_tflops", field);
    r.attention_bwd_tflops = number(o, "attention_bwd_tflops", field);
    return r;
  }

  LinkClass link(const json& o, const std::string& field) const {
    LinkClass l;
    l.latency_us = number(o, "latency_us", field);
    l.gbps = number(o, "gbps", field);
    return l;
  }
};

json rates_json(const ComputeRates& r) {
  return {{"gemm_peak_tflops", r.gemm_peak_tflops},
          {"gemm_half_rate_dim", r.gemm_half_rate_dim},
          {"attention_fwd_tflops", r.attention_fwd_tflops},
          {"attention_bwd_tflops", r.attention_bwd_tflops}};
}

}  // namespace

const std::string& Profile::link_name(bool spans_nodes) const {
  if (spans_nodes && links.count(kInter)) return kInter;
  if (!links.count(kIntra))
    throw ConfigError(fmt::format("profile {}: field links.{} is missing", name, spans_nodes ? kInter : kIntra));
  return kIntra;
}

const LinkClass& Profile::link(bool spans_nodes) const { return links.at(link_name(spans_nodes)); }

Profile scale_compute(Profile p, double efficiency) {
  for (ComputeRates* r : {&p.bf16, &p.fp32}) {
    r->gemm_peak_tflops *= efficiency;
    r->attention_fwd_tflops *= efficiency;
    r->attention_bwd_tflops *= efficiency;
  }
  p.elementwise_gbps *= efficiency;
  return p;
}

Profile parse_profile(const std::string& text, const std::string& where) {
  json j;
  try {
    j = core::parse_json(text);
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("{}: not valid JSON: {}", where, e.what()));
  }
  if (!j.is_object()) throw ConfigError(fmt::format("{}: not valid JSON: the top level must be an object", where));
  const Reader rd{where};
  Profile p;
  if (auto it = j.find("name"); it != j.end()) {
    if (!it->is_string()) rd.fail("name", fmt::format("is {}: it must be a string", Reader::shown(*it)));
    p.name = it->get<std::string>();
  }
  if (auto it = j.find("source"); it != j.end()) {
    if (!it->is_string()) rd.fail("source", fmt::format("is {}: it must be a string", Reader::shown(*it)));
    p.source = it->get<std::string>();
  }
  const double dpn = rd.number(j, "devices_per_node", "");
  if (dpn != std::floor(dpn) || dpn > 1e6)
    rd.fail("devices_per_node", fmt::format("is {}: it must be a positive integer", dpn));
  p.devices_per_node = int(dpn);

  const json& compute = rd.object(j, "compute", "compute");
  p.bf16 = rd.rates(rd.object(compute, "bf16", "compute.bf16"), "compute.bf16");
  if (compute.contains("fp32")) {
    p.fp32 = rd.rates(rd.object(compute, "fp32", "compute.fp32"), "compute.fp32");
  } else if (compute.contains("fp32_over_bf16")) {
    const double f = rd.number(compute, "fp32_over_bf16", "compute");
    p.fp32 = p.bf16;
    p.fp32.gemm_peak_tflops *= f;
    p.fp32.attention_fwd_tflops *= f;
    p.fp32.attention_bwd_tflops *= f;
  } else {
    rd.fail("compute.fp32", "is missing (give it, or compute.fp32_over_bf16)");
  }

  p.elementwise_gbps = rd.number(j, "elementwise_gbps", "");
  p.task_overhead_us = rd.number(j, "task_overhead_us", "");
  if (j.contains("compute_slowdown_during_comm"))
    p.compute_slowdown_during_comm = rd.number(j, "compute_slowdown_during_comm", "", /*allow_zero=*/true);
  if (j.contains("device_memory_gib")) p.device_memory_gib = rd.number(j, "device_memory_gib", "");
  if (j.contains("memory_reserve_gib")) {
    p.memory_reserve_gib = rd.number(j, "memory_reserve_gib", "", /*allow_zero=*/true);
    if (p.device_memory_gib > 0 && p.memory_reserve_gib >= p.device_memory_gib)
      rd.fail("memory_reserve_gib", fmt::format("is {}: it must be less than device_memory_gib {}",
                                                p.memory_reserve_gib, p.device_memory_gib));
  }

  const json& links = rd.object(j, "links", "links");
  p.links[kIntra] = rd.link(rd.object(links, kIntra, "links.intra"), "links.intra");
  if (links.contains(kInter)) p.links[kInter] = rd.link(rd.object(links, kInter, "links.inter"), "links.inter");
  if (p.name.empty()) p.name = where;
  return p;
}

Profile load_profile(const std::string& path, const std::string& flag) {
  const std::string where = fmt::format("{} {}", flag, path);
  std::error_code ec;
  std::ifstream f;
  if (std::filesystem::is_regular_file(path, ec)) f.open(path, std::ios::binary);
  if (!f.is_open()) throw ConfigError(fmt::format("{}: cannot be read", where));
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw ConfigError(fmt::format("{}: cannot be read", where));
  Profile p = parse_profile(ss.str(), where);
  if (p.name == where) p.name = path;
  return p;
}

std::string profile_json(const Profile& p) {
  json links = json::object();
  for (const auto& [k, l] : p.links) links[k] = {{"latency_us", l.latency_us}, {"gbps", l.gbps}};
  json j = {{"name", p.name},
            {"source", p.source},
            {"devices_per_node", p.devices_per_node},
            {"compute", {{"bf16", rates_json(p.bf16)}, {"fp32", rates_json(p.fp32)}}},
            {"elementwise_gbps", p.elementwise_gbps},
            {"task_overhead_us", p.task_overhead_us},
            {"compute_slowdown_during_comm", p.compute_slowdown_during_comm},
            {"links", links}};
  if (p.device_memory_gib > 0) {
    j["device_memory_gib"] = p.device_memory_gib;
    j["memory_reserve_gib"] = p.memory_reserve_gib;
  }
  return j.dump(2) + "\n";
}

void save_profile(const Profile& p, const std::string& path) { core::write_file_atomic(path, profile_json(p)); }

}  // namespace ampipe::sim
