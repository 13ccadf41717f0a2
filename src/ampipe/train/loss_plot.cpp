#include "ampipe/train/loss_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "ampipe/core/png.h"

namespace ampipe::train {

namespace {
constexpr int kW = 800, kH = 500, kLeft = 50, kRight = 20, kTop = 20, kBottom = 40;

struct Rgb {
  uint8_t r, g, b;
};
constexpr Rgb kAxis{90, 90, 90}, kGrid{225, 225, 225}, kTrain{31, 119, 180}, kValid{255, 127, 14};

void dot(core::RgbImage& img, int x, int y, int radius, Rgb c) {
  for (int dy = -radius; dy <= radius; ++dy)
    for (int dx = -radius; dx <= radius; ++dx)
      if (dx * dx + dy * dy <= radius * radius) img.set(x + dx, y + dy, c.r, c.g, c.b);
}

void line(core::RgbImage& img, int x0, int y0, int x1, int y1, Rgb c, int radius) {  // Bresenham, thick
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  for (;;) {
    dot(img, x0, y0, radius, c);
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}
}  // namespace

std::string write_loss_plot(const std::string& path, const TrainResult& r) {
  if (r.iterations.empty()) return "no iteration ran: no loss plot written";
  const double it0 = double(r.iterations.front().iteration), it1 = double(r.iterations.back().iteration);
  double lo = r.iterations.front().lm_loss, hi = lo;
  for (const IterationStats& s : r.iterations) lo = std::min(lo, s.lm_loss), hi = std::max(hi, s.lm_loss);
  for (const EvalStats& e : r.evals) lo = std::min(lo, e.lm_loss), hi = std::max(hi, e.lm_loss);
  const double pad = std::max(1e-6, 0.05 * (hi - lo));
  const double ylo = lo - pad, yhi = hi + pad;
  auto px = [&](double it) { return kLeft + int(std::lround((it - it0) / std::max(1.0, it1 - it0) * (kW - kLeft - kRight))); };
  auto py = [&](double loss) { return kTop + int(std::lround((yhi - loss) / (yhi - ylo) * (kH - kTop - kBottom))); };
  core::RgbImage img(kW, kH);
  for (int k = 0; k <= 4; ++k) {  // horizontal grid at fifths of the range, vertical at quarters of the run
    const int y = kTop + k * (kH - kTop - kBottom) / 4, x = kLeft + k * (kW - kLeft - kRight) / 4;
    line(img, kLeft, y, kW - kRight, y, kGrid, 0);
    line(img, x, kTop, x, kH - kBottom, kGrid, 0);
  }
  line(img, kLeft, kTop, kLeft, kH - kBottom, kAxis, 0);
  line(img, kLeft, kH - kBottom, kW - kRight, kH - kBottom, kAxis, 0);
  for (size_t i = 1; i < r.iterations.size(); ++i)
    line(img, px(double(r.iterations[i - 1].iteration)), py(r.iterations[i - 1].lm_loss),
         px(double(r.iterations[i].iteration)), py(r.iterations[i].lm_loss), kTrain, 1);
  if (r.iterations.size() == 1) dot(img, px(it0), py(r.iterations[0].lm_loss), 2, kTrain);
  for (size_t i = 0; i < r.evals.size(); ++i) {
    if (i > 0)
      line(img, px(double(r.evals[i - 1].iteration)), py(r.evals[i - 1].lm_loss), px(double(r.evals[i].iteration)),
           py(r.evals[i].lm_loss), kValid, 1);
    dot(img, px(double(r.evals[i].iteration)), py(r.evals[i].lm_loss), 4, kValid);
  }
  try {
    core::write_png(path, img);
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("--loss-plot {}: the file cannot be written: {}", path, e.what()));
  }
  return fmt::format("iterations {}..{}, loss {:.3f}..{:.3f} (grid: quarters of the run, quarters of the range; blue: "
                     "training loss, orange: validation loss)",
                     int64_t(it0), int64_t(it1), lo, hi);
}

}  // namespace ampipe::train
