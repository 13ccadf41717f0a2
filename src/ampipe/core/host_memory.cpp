#include "ampipe/core/host_memory.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "ampipe/core/error.h"

namespace ampipe::core {

namespace {

// The first integer after `key` in a "key value" file (/proc/meminfo, /proc/self/status, memory.stat); -1 if absent.
int64_t field(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, key.size(), key) == 0) {
      std::istringstream rest(line.substr(key.size()));
      int64_t v = -1;
      if (rest >> v) return v;
      return -1;
    }
  return -1;
}

// A file holding one integer (or "max"); -1 when absent, unreadable or "max".
int64_t single_value(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return -1;
  try {
    return std::stoll(text);
  } catch (...) {
    return -1;  // beyond int64: no limit
  }
}

bool is_dir(const std::string& path) {
  std::ifstream probe(path + "/cgroup.procs");
  return bool(probe);
}

// The directory `rel` below `mount` and each of its ancestors up to the mount, leaf first. A path that does not
// exist (a cgroup namespace whose root is the mount) gives the mount alone.
std::vector<std::string> cgroup_dirs(const std::string& mount, std::string rel) {
  std::vector<std::string> dirs;
  while (!rel.empty() && rel != "/") {
    if (is_dir(mount + rel)) dirs.push_back(mount + rel);
    const size_t slash = rel.rfind('/');
    rel = slash == std::string::npos ? std::string() : rel.substr(0, slash);
  }
  dirs.push_back(mount);
  return dirs;
}

// Limit minus the usage that cannot be reclaimed (usage - inactive file cache, as `docker stats` counts it).
struct CgroupFit {
  int64_t left = -1;
  std::string source;
};

void consider(CgroupFit& best, const std::string& dir, const char* limit_file, const char* usage_file,
              const char* inactive_key, const char* version) {
  const int64_t limit = single_value(dir + "/" + limit_file);
  if (limit < 0 || limit >= (int64_t(1) << 62)) return;  // "max", or v1's "unlimited" page-rounded INT64_MAX
  int64_t used = std::max<int64_t>(single_value(dir + "/" + usage_file), 0);
  const int64_t inactive = field(dir + "/memory.stat", inactive_key);
  if (inactive > 0) used = std::max<int64_t>(used - inactive, 0);
  const int64_t left = std::max<int64_t>(limit - used, 0);
  if (best.left >= 0 && left >= best.left) return;
  best.left = left;
  best.source = fmt::format("cgroup {} {} {} - {} in use", version, limit_file, format_bytes(double(limit)),
                            format_bytes(double(used)));
}

CgroupFit cgroup_fit() {
  CgroupFit best;
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), rel = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {  // cgroup v2 (unified)
      for (const std::string& dir : cgroup_dirs("/sys/fs/cgroup", rel))
        consider(best, dir, "memory.max", "memory.current", "inactive_file ", "v2");
    } else {
      std::istringstream list(controllers);
      std::string c;
      bool memory = false;
      while (std::getline(list, c, ',')) memory |= c == "memory";
      if (!memory) continue;
      for (const std::string& dir : cgroup_dirs("/sys/fs/cgroup/memory", rel))
        consider(best, dir, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file ", "v1");
    }
  }
  return best;
}

int64_t status_bytes(const char* key) {
  const int64_t kb = field("/proc/self/status", key);
  return kb < 0 ? -1 : kb * 1024;
}

}  // namespace

HostMemory available_memory() {
  HostMemory m;
  const int64_t kb = field("/proc/meminfo", "MemAvailable:");
  if (kb >= 0) {
    m.bytes = kb * 1024;
    m.source = "MemAvailable";
  }
  const CgroupFit cg = cgroup_fit();
  if (cg.left >= 0 && (m.bytes < 0 || cg.left < m.bytes)) {
    m.bytes = cg.left;
    m.source = cg.source;
  }
  return m;
}

int64_t current_rss_bytes() { return status_bytes("VmRSS:"); }
int64_t peak_rss_bytes() { return status_bytes("VmHWM:"); }

bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return bool(f);
}

int64_t parse_bytes(const std::string& flag, const std::string& text) {
  auto bad = [&]() {
    return ConfigError(fmt::format("{} {} is invalid: it must be a byte count such as 8G, 512M or 1048576 (binary "
                                   "suffixes K, M, G, T, P; 0 turns the memory check off; auto, the default, compares with the host's available memory)",
                                   flag, text.empty() ? std::string("\"\"") : text));
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number = text.substr(0, i);
  std::string suffix = text.substr(i);
  if (number.empty() || std::count(number.begin(), number.end(), '.') > 1 || number == ".") throw bad();
  for (char& c : suffix) c = char(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.size() >= 2 && suffix.compare(suffix.size() - 2, 2, "IB") == 0) suffix.resize(suffix.size() - 2);
  else if (suffix.size() == 2 && suffix.back() == 'B') suffix.resize(1);
  static constexpr const char* kSuffixes = "KMGTP";
  double scale = 1;
  if (suffix == "B") suffix.clear();
  if (!suffix.empty()) {
    const char* p = suffix.size() == 1 ? std::strchr(kSuffixes, suffix[0]) : nullptr;
    if (p == nullptr || *p == '\0') throw bad();
    scale = std::pow(1024.0, double(p - kSuffixes + 1));
  }
  const double v = std::stod(number) * scale;
  if (!(v < 9.2e18)) throw bad();
  if (number.find('.') == std::string::npos && suffix.empty()) {  // exact for plain integers
    try {
      return std::stoll(number);
    } catch (...) {
      throw bad();
    }
  }
  return int64_t(std::llround(v));
}

std::string format_bytes(double v) {
  static constexpr const char* kPrefix[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  size_t i = 0;
  while (v >= 999.5 && i + 1 < std::size(kPrefix)) {
    v /= 1024;
    ++i;
  }
  const int prec = i == 0 || v >= 99.95 ? 0 : v >= 9.995 ? 1 : 2;
  return fmt::format("{:.{}f} {}", v, prec, kPrefix[i]);
}

}  // namespace ampipe::core
