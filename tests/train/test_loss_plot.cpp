// The loss plot (train/loss_plot.h): a valid PNG of the stated size, under 200 KB, with text where only text can
// be. The picture is read back with cairo's PNG reader and looked at pixel by pixel, without OCR: the axes are found
// as the row and the column with the most dark grey pixels; below the x axis (past its tick marks) and left of the
// y axis only tick labels and axis labels are drawn, so separate clusters of inked columns (rows) there are the
// tick numbers. tests/train/check_png.py reads the CLI's plot with an independent PNG decoder.
#include <cairo.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ampipe/core/error.h"
#include "ampipe/train/loss_plot.h"

using namespace ampipe;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ampipe_test_loss_plot_" + name)).string();
}

// A run of `iters` iterations with a decaying, noisy loss and an evaluation every `every` iterations (none: 0).
train::TrainResult fake_run(int iters, int every) {
  train::TrainResult r;
  for (int i = 1; i <= iters; ++i)
    r.iterations.push_back({.iteration = i, .lm_loss = 2.9 + 2.6 * std::exp(-i / 60.0) + 0.08 * std::sin(i * 1.7)});
  for (int i = every; every > 0 && i <= iters; i += every) r.evals.push_back({i, 3.0 + 2.4 * std::exp(-i / 60.0)});
  return r;
}

struct Image {  // 0x00RRGGBB per pixel
  int w = 0, h = 0;
  std::vector<uint32_t> px;
  uint32_t at(int x, int y) const { return px[size_t(y) * size_t(w) + size_t(x)]; }
};

Image read_png(const std::string& path) {
  cairo_surface_t* s = cairo_image_surface_create_from_png(path.c_str());
  EXPECT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS) << path;
  Image img;
  if (cairo_surface_status(s) == CAIRO_STATUS_SUCCESS) {
    img.w = cairo_image_surface_get_width(s);
    img.h = cairo_image_surface_get_height(s);
    const int stride = cairo_image_surface_get_stride(s);
    const unsigned char* d = cairo_image_surface_get_data(s);
    for (int y = 0; y < img.h; ++y)
      for (int x = 0; x < img.w; ++x)
        img.px.push_back(reinterpret_cast<const uint32_t*>(d + size_t(y) * size_t(stride))[x] & 0xFFFFFFu);
  }
  cairo_surface_destroy(s);
  return img;
}

int ch(uint32_t p, int shift) { return int((p >> shift) & 0xFF); }
bool ink(uint32_t p) { return p != 0xFFFFFFu; }
// Text and axes: grey (channels within 12 of each other) and dark. The grid is light grey, the curves coloured.
bool dark_grey(uint32_t p) {
  const int r = ch(p, 16), g = ch(p, 8), b = ch(p, 0);
  return std::max({r, g, b}) - std::min({r, g, b}) <= 12 && std::max({r, g, b}) < 160;
}
bool near(uint32_t p, int r, int g, int b) {
  return std::abs(ch(p, 16) - r) <= 12 && std::abs(ch(p, 8) - g) <= 12 && std::abs(ch(p, 0) - b) <= 12;
}

// Runs of true in `v` separated by at least `gap` false entries.
int clusters(const std::vector<bool>& v, int gap) {
  int n = 0, since = gap;
  for (bool b : v) {
    if (b && since >= gap) ++n;
    since = b ? 0 : since + 1;
  }
  return n;
}

struct Axes {
  int row = 0, col = 0, top = 0;  // the x axis's row, the y axis's column, the y axis's first row
};

Axes find_axes(const Image& img) {
  Axes a;
  int best = 0;
  for (int y = 0; y < img.h; ++y) {
    int n = 0;
    for (int x = 0; x < img.w; ++x) n += dark_grey(img.at(x, y));
    if (n > best) best = n, a.row = y;
  }
  EXPECT_GT(best, img.w / 2) << "no x axis";
  best = 0;
  for (int x = 0; x < img.w; ++x) {
    int n = 0;
    for (int y = 0; y < img.h; ++y) n += dark_grey(img.at(x, y));
    if (n > best) best = n, a.col = x;
  }
  EXPECT_GT(best, img.h / 2) << "no y axis";
  while (a.top < a.row && !dark_grey(img.at(a.col, a.top))) ++a.top;
  return a;
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

uint32_t be32(const std::string& s, size_t at) {
  return uint32_t(uint8_t(s[at])) << 24 | uint32_t(uint8_t(s[at + 1])) << 16 | uint32_t(uint8_t(s[at + 2])) << 8 |
         uint32_t(uint8_t(s[at + 3]));
}

}  // namespace

TEST(LossPlot, IsAPngOfTheStatedSizeUnder200Kb) {
  const std::string path = temp_path("size.png");
  const std::string said = train::write_loss_plot(path, fake_run(300, 50), "a title");
  EXPECT_EQ(said.rfind("iterations 1..300, loss ", 0), 0u) << said;
  const std::string png = file_bytes(path);
  ASSERT_GT(png.size(), 33u);
  EXPECT_LT(png.size(), 200u * 1024u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  EXPECT_EQ(be32(png, 16), 800u);  // width, height
  EXPECT_EQ(be32(png, 20), 500u);
  // A long noisy run (a curve filling much of the plot area) stays under the limit too.
  train::TrainResult longer = fake_run(5000, 250);
  for (size_t i = 0; i < longer.iterations.size(); ++i) longer.iterations[i].lm_loss += 0.3 * std::sin(double(i * i));
  train::write_loss_plot(path, longer, "a title");
  EXPECT_LT(std::filesystem::file_size(path), 200u * 1024u);
  std::filesystem::remove(path);
}

TEST(LossPlot, HasTickNumbersAxisLabelsTitleAndLegend) {
  const std::string path = temp_path("text.png");
  train::write_loss_plot(path, fake_run(300, 50),
                         "GPT-MoE 2 layers, s 64, h 64, E 4 top-2, fp32 | tp 1 cp 1 ep 2 dp 1 | AMPipe degree 2");
  const Image img = read_png(path);
  ASSERT_EQ(img.w, 800);
  ASSERT_EQ(img.h, 500);
  const Axes a = find_axes(img);
  // Below the x axis, past its 5-pixel tick marks: the x tick numbers (0, 50, ..., 300) and "iteration".
  std::vector<bool> cols(size_t(img.w), false);
  for (int y = a.row + 8; y < img.h; ++y)
    for (int x = 0; x < img.w; ++x) cols[size_t(x)] = cols[size_t(x)] || ink(img.at(x, y));
  EXPECT_GE(clusters(cols, 4), 5) << "x tick labels";
  // Left of the y axis, past its tick marks: the y tick numbers (a column band next to the axis) and the rotated y
  // label (a band further left); in the band next to the axis, one cluster of rows per tick number.
  std::vector<bool> left(size_t(a.col), false);
  for (int y = a.top; y < a.row; ++y)
    for (int x = 0; x + 8 < a.col; ++x) left[size_t(x)] = left[size_t(x)] || ink(img.at(x, y));
  EXPECT_GE(clusters(left, 4), 2) << "the y label and the y tick labels";
  int band = a.col - 9;  // the tick labels' band: from the axis leftwards to the first blank column
  while (band > 0 && !left[size_t(band)]) --band;
  const int band_end = band;
  while (band > 0 && left[size_t(band)]) --band;
  std::vector<bool> rows(size_t(img.h), false);
  for (int y = a.top; y < a.row; ++y)
    for (int x = band; x <= band_end; ++x) rows[size_t(y)] = rows[size_t(y)] || ink(img.at(x, y));
  EXPECT_GE(clusters(rows, 4), 4) << "y tick labels";
  // Above the plot area: the title, most of the width.
  int title_cols = 0;
  for (int x = 0; x < img.w; ++x) {
    bool any = false;
    for (int y = 0; y + 2 < a.top; ++y) any = any || ink(img.at(x, y));
    title_cols += any;
  }
  EXPECT_GT(title_cols, 400) << "title";
  // Inside the plot area the only dark grey is the legend's text; the curves are there in their colours.
  int legend_text = 0, blue = 0, orange = 0;
  for (int y = a.top; y + 2 < a.row; ++y)
    for (int x = a.col + 2; x < img.w; ++x) {
      legend_text += dark_grey(img.at(x, y));
      blue += near(img.at(x, y), 31, 119, 180);
      orange += near(img.at(x, y), 255, 127, 14);
    }
  EXPECT_GT(legend_text, 150) << "legend text";
  EXPECT_GT(blue, img.w / 2) << "training curve";
  EXPECT_GT(orange, 50) << "validation curve";
  std::filesystem::remove(path);
}

TEST(LossPlot, WithoutEvaluationsTheLegendHasOneEntry) {
  const std::string with = temp_path("with.png"), without = temp_path("without.png");
  train::write_loss_plot(with, fake_run(40, 10), "t");
  train::write_loss_plot(without, fake_run(40, 0), "t");
  auto legend_and_orange = [](const Image& img) {
    const Axes a = find_axes(img);
    int text = 0, orange = 0;
    for (int y = a.top; y + 2 < a.row; ++y)
      for (int x = a.col + 2; x < img.w; ++x) {
        text += dark_grey(img.at(x, y));
        orange += near(img.at(x, y), 255, 127, 14);
      }
    return std::pair{text, orange};
  };
  const auto [text_with, orange_with] = legend_and_orange(read_png(with));
  const auto [text_without, orange_without] = legend_and_orange(read_png(without));
  EXPECT_GT(orange_with, 50);
  EXPECT_EQ(orange_without, 0);
  EXPECT_GT(text_without, 50);                   // "training loss"
  EXPECT_GT(text_with, text_without + 50);       // and "validation loss"
  std::filesystem::remove(with);
  std::filesystem::remove(without);
}

TEST(LossPlot, OneIterationAndNonFiniteLossesStillDraw) {
  const std::string path = temp_path("one.png");
  train::TrainResult r = fake_run(1, 0);
  EXPECT_EQ(train::write_loss_plot(path, r, "t").rfind("iterations 1..1, loss ", 0), 0u);
  r = fake_run(20, 5);
  r.iterations[7].lm_loss = std::nan("");
  EXPECT_EQ(train::write_loss_plot(path, r, "t").rfind("iterations 1..20, loss ", 0), 0u);
  EXPECT_EQ(read_png(path).w, 800);
  std::filesystem::remove(path);
}

TEST(LossPlot, NoIterationWritesNothing) {
  const std::string path = temp_path("none.png");
  std::filesystem::remove(path);
  EXPECT_EQ(train::write_loss_plot(path, train::TrainResult{}, "t"), "no iteration ran: no loss plot written");
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(LossPlot, AnUnwritablePathIsAConfigErrorNamingTheFlagAndPath) {
  try {
    train::write_loss_plot("/proc/no/such/loss.png", fake_run(5, 0), "t");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--loss-plot /proc/no/such/loss.png: the file cannot be written"),
              std::string::npos)
        << e.what();
  }
}

TEST(LossPlot, TitleNamesTheModelAndTheParallelLayout) {
  train::TrainConfig c;
  c.num_layers = 2;
  c.layer.seq_length = 64;
  c.layer.hidden_size = 64;
  c.layer.num_experts = 4;
  c.layer.moe_router_topk = 2;
  c.layer.expert_model_parallel_size = 2;
  c.ampipe_degree = 2;
  EXPECT_EQ(train::loss_plot_title(c, 2),
            "GPT-MoE 2 layers, s 64, h 64, E 4 top-2, fp32 | tp 1 cp 1 ep 2 dp 2 | AMPipe degree 2");
  c.num_layers = 1;
  c.layer.bf16 = true;
  c.layer.tensor_model_parallel_size = 2;
  c.layer.sequence_parallel = true;
  c.layer.context_parallel_size = 2;
  EXPECT_EQ(train::loss_plot_title(c, 8),
            "GPT-MoE 1 layer, s 64, h 64, E 4 top-2, bf16 | tp 2 (sp) cp 2 ep 2 dp 2 | AMPipe degree 2");
}
