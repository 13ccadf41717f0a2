#include "ampipe/train/loss_plot.h"

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "ampipe/core/safetensors.h"

namespace ampipe::train {

namespace {

constexpr int kW = 800, kH = 500;
constexpr int kTop = 44, kRight = 24, kBottom = 58;  // the left margin follows the widest y tick label
constexpr double kTick = 5;                          // tick marks, outside the plot area
constexpr double kFont = 12, kTitleFont = 14;
const char* const kFace = "sans-serif";  // fontconfig's choice (DejaVu Sans on Debian: fonts-dejavu-core)

struct Rgb {
  double r, g, b;
};
constexpr Rgb kText{0.12, 0.12, 0.12}, kAxis{0.25, 0.25, 0.25}, kGrid{0.88, 0.88, 0.88},
    kTrain{31 / 255.0, 119 / 255.0, 180 / 255.0}, kValid{255 / 255.0, 127 / 255.0, 14 / 255.0};

// An axis: the range drawn and its ticks at a "nice" step (1, 2 or 5 times a power of ten).
struct Axis {
  double lo = 0, hi = 1;
  std::vector<double> ticks;
  int decimals = 0;
  std::string label(double v) const { return fmt::format("{:.{}f}", v, decimals); }
};

Axis nice_axis(double lo, double hi, int target, bool integer) {
  Axis a{lo, hi, {}, 0};
  const double raw = (hi - lo) / target, mag = std::pow(10.0, std::floor(std::log10(raw))), f = raw / mag;
  double step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  if (integer) step = std::max(1.0, std::round(step));
  a.decimals = std::max(0, -int(std::floor(std::log10(step) + 1e-9)));
  for (double i = std::ceil(lo / step - 1e-9); i <= std::floor(hi / step + 1e-9); ++i)
    a.ticks.push_back(std::abs(i) < 0.5 ? 0.0 : i * step);  // no "-0.00"
  return a;
}

struct CairoDeleter {
  void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
  void operator()(cairo_t* c) const { cairo_destroy(c); }
};

void set(cairo_t* cr, Rgb c, double alpha = 1) { cairo_set_source_rgba(cr, c.r, c.g, c.b, alpha); }

double text_width(cairo_t* cr, const std::string& s) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  return e.x_advance;
}

// Draws `s` with its reference point at (x, y) moved by -ax * width and +ay * the font's cap height: ax 0.5 centres
// it horizontally, ay 0.5 vertically, ay 1 hangs it below y.
void text(cairo_t* cr, const std::string& s, double x, double y, double ax, double ay) {
  cairo_text_extents_t cap;
  cairo_text_extents(cr, "0", &cap);
  cairo_move_to(cr, x - ax * text_width(cr, s), y + ay * -cap.y_bearing);
  cairo_show_text(cr, s.c_str());
}

cairo_status_t append_png(void* out, const unsigned char* data, unsigned int n) {
  static_cast<std::string*>(out)->append(reinterpret_cast<const char*>(data), n);
  return CAIRO_STATUS_SUCCESS;
}

// A polyline through the finite points (a non-finite loss lifts the pen).
void polyline(cairo_t* cr, const std::vector<std::pair<double, double>>& pts) {
  bool down = false;
  for (const auto& [x, y] : pts) {
    if (!std::isfinite(y)) {
      down = false;
      continue;
    }
    down ? cairo_line_to(cr, x, y) : cairo_move_to(cr, x, y);
    down = true;
  }
}

struct Frame {  // the plot area in pixels and the two axes
  double left, top, right, bottom;
  Axis x, y;
  double px(double it) const { return left + (it - x.lo) / (x.hi - x.lo) * (right - left); }
  double py(double loss) const { return bottom - (loss - y.lo) / (y.hi - y.lo) * (bottom - top); }
};

void draw_axes(cairo_t* cr, const Frame& f, const std::string& title) {
  cairo_set_line_width(cr, 1);
  set(cr, kGrid);  // grid lines at the ticks, on pixel centres so they stay one crisp pixel wide
  for (double v : f.x.ticks) {
    const double x = std::round(f.px(v)) + 0.5;
    cairo_move_to(cr, x, f.top);
    cairo_line_to(cr, x, f.bottom);
  }
  for (double v : f.y.ticks) {
    const double y = std::round(f.py(v)) + 0.5;
    cairo_move_to(cr, f.left, y);
    cairo_line_to(cr, f.right, y);
  }
  cairo_stroke(cr);
  set(cr, kAxis);  // the axes (left and bottom) and their tick marks
  const double ax = std::round(f.left) + 0.5, ay = std::round(f.bottom) + 0.5;
  cairo_move_to(cr, ax, f.top);
  cairo_line_to(cr, ax, ay);
  cairo_line_to(cr, f.right, ay);
  for (double v : f.x.ticks) {
    cairo_move_to(cr, std::round(f.px(v)) + 0.5, ay);
    cairo_rel_line_to(cr, 0, kTick);
  }
  for (double v : f.y.ticks) {
    cairo_move_to(cr, ax, std::round(f.py(v)) + 0.5);
    cairo_rel_line_to(cr, -kTick, 0);
  }
  cairo_stroke(cr);
  set(cr, kText);
  cairo_select_font_face(cr, kFace, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, kFont);
  for (double v : f.x.ticks) text(cr, f.x.label(v), f.px(v), ay + kTick + 4, 0.5, 1);
  for (double v : f.y.ticks) text(cr, f.y.label(v), ax - kTick - 4, f.py(v), 1, 0.5);
  text(cr, "iteration", (f.left + f.right) / 2, kH - 14, 0.5, 0);
  cairo_save(cr);  // the y label, rotated, centred on the plot area's height
  cairo_translate(cr, 8, (f.top + f.bottom) / 2);
  cairo_rotate(cr, -M_PI / 2);
  text(cr, "lm loss: mean cross-entropy (nats/token)", 0, 0, 0.5, 1);
  cairo_restore(cr);
  cairo_select_font_face(cr, kFace, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
  double size = kTitleFont;  // shrunk until a long title fits the width
  cairo_set_font_size(cr, size);
  while (size > 7 && text_width(cr, title) > kW - 16) cairo_set_font_size(cr, size -= 0.5);
  text(cr, title, kW / 2.0, kTop / 2.0, 0.5, 0.5);
}

void draw_curves(cairo_t* cr, const Frame& f, const TrainResult& r) {
  cairo_save(cr);
  cairo_rectangle(cr, f.left, f.top - 6, f.right - f.left + 6, f.bottom - f.top + 6);
  cairo_clip(cr);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  std::vector<std::pair<double, double>> pts;
  for (const IterationStats& s : r.iterations) pts.emplace_back(f.px(double(s.iteration)), f.py(s.lm_loss));
  set(cr, kTrain);
  cairo_set_line_width(cr, 2);
  polyline(cr, pts);
  cairo_stroke(cr);
  if (r.iterations.size() == 1) {
    cairo_arc(cr, pts[0].first, pts[0].second, 3, 0, 2 * M_PI);
    cairo_fill(cr);
  }
  pts.clear();
  for (const EvalStats& e : r.evals) pts.emplace_back(f.px(double(e.iteration)), f.py(e.lm_loss));
  set(cr, kValid);
  cairo_set_line_width(cr, 2);
  polyline(cr, pts);
  cairo_stroke(cr);
  for (const auto& [x, y] : pts)
    if (std::isfinite(y)) {
      cairo_arc(cr, x, y, 4, 0, 2 * M_PI);
      cairo_fill(cr);
    }
  cairo_restore(cr);
}

void draw_legend(cairo_t* cr, const Frame& f, bool validation) {
  cairo_select_font_face(cr, kFace, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, kFont);
  const std::string train = "training loss", valid = "validation loss";
  const double row = 20, sample = 28, pad = 8;
  const double w = pad + sample + 8 + std::max(text_width(cr, train), validation ? text_width(cr, valid) : 0) + pad;
  const double h = pad + row * (validation ? 2 : 1) + pad - 6;
  const double x0 = std::round(f.right - 10 - w) + 0.5, y0 = std::round(f.top + 10) + 0.5;
  cairo_rectangle(cr, x0, y0, std::round(w), std::round(h));
  set(cr, {1, 1, 1}, 0.9);
  cairo_fill_preserve(cr);
  set(cr, kGrid, 1);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  for (int i = 0; i < (validation ? 2 : 1); ++i) {
    const double y = y0 + pad + row * i + 7;
    set(cr, i == 0 ? kTrain : kValid);
    cairo_set_line_width(cr, 2);
    cairo_move_to(cr, x0 + pad, y);
    cairo_rel_line_to(cr, sample, 0);
    cairo_stroke(cr);
    if (i == 1) {
      cairo_arc(cr, x0 + pad + sample / 2, y, 4, 0, 2 * M_PI);
      cairo_fill(cr);
    }
    set(cr, kText);
    text(cr, i == 0 ? train : valid, x0 + pad + sample + 8, y, 0, 0.5);
  }
}

}  // namespace

std::string loss_plot_title(const TrainConfig& cfg, int world) {
  const model::LayerConfig& l = cfg.layer;
  return fmt::format("GPT-MoE {} layer{}, s {}, h {}, E {} top-{}, {} | tp {}{} cp {} ep {} dp {} | AMPipe degree {}",
                     cfg.num_layers, cfg.num_layers == 1 ? "" : "s", l.seq_length, l.hidden_size, l.num_experts,
                     l.moe_router_topk, l.bf16 ? "bf16" : "fp32", l.tp(), l.sp() ? " (sp)" : "", l.cp(),
                     l.expert_model_parallel_size, cfg.data_parallel_size(world), cfg.ampipe_degree);
}

std::string write_loss_plot(const std::string& path, const TrainResult& r, const std::string& title) {
  if (r.iterations.empty()) return "no iteration ran: no loss plot written";
  const double it0 = double(r.iterations.front().iteration), it1 = double(r.iterations.back().iteration);
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const IterationStats& s : r.iterations)
    if (std::isfinite(s.lm_loss)) lo = std::min(lo, s.lm_loss), hi = std::max(hi, s.lm_loss);
  for (const EvalStats& e : r.evals)
    if (std::isfinite(e.lm_loss)) lo = std::min(lo, e.lm_loss), hi = std::max(hi, e.lm_loss);
  if (lo > hi) lo = hi = 0;  // no finite loss at all: empty axes
  const double ypad = hi > lo ? 0.05 * (hi - lo) : std::max(0.05, 0.05 * std::abs(lo));
  const double xspan = std::max(it1 - it0, 2.0), xmid = (it0 + it1) / 2;
  Frame f{0, kTop, kW - kRight, kH - kBottom, nice_axis(xmid - 0.52 * xspan, xmid + 0.52 * xspan, 8, true),
          nice_axis(lo - ypad, hi + ypad, 6, false)};

  std::unique_ptr<cairo_surface_t, CairoDeleter> surface(cairo_image_surface_create(CAIRO_FORMAT_RGB24, kW, kH));
  std::unique_ptr<cairo_t, CairoDeleter> owner(cairo_create(surface.get()));
  cairo_t* cr = owner.get();
  set(cr, {1, 1, 1});
  cairo_paint(cr);
  cairo_select_font_face(cr, kFace, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, kFont);
  double widest = 0;  // the left margin: the rotated y label, a gap, the widest tick label, the tick
  for (double v : f.y.ticks) widest = std::max(widest, text_width(cr, f.y.label(v)));
  f.left = std::round(8 + kFont + 12 + widest + 4 + kTick);
  draw_axes(cr, f, title);
  draw_curves(cr, f, r);
  draw_legend(cr, f, !r.evals.empty());
  cairo_surface_flush(surface.get());
  std::string png;
  const cairo_status_t st = cairo_status(cr) != CAIRO_STATUS_SUCCESS
                                ? cairo_status(cr)
                                : cairo_surface_write_to_png_stream(surface.get(), append_png, &png);
  AMPIPE_CHECK(st == CAIRO_STATUS_SUCCESS, "cairo could not draw the loss plot: {}", cairo_status_to_string(st));
  try {
    core::write_file_atomic(path, png);
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("--loss-plot {}: the file cannot be written: {}", path, e.what()));
  }
  return fmt::format("iterations {}..{}, loss {:.3f}..{:.3f}", int64_t(it0), int64_t(it1), lo, hi);
}

}  // namespace ampipe::train
