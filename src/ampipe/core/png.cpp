#include "ampipe/core/png.h"

#include <array>
#include <cstring>

#include "ampipe/core/error.h"
#include "ampipe/core/safetensors.h"

namespace ampipe::core {

RgbImage::RgbImage(int w, int h, uint8_t r, uint8_t g, uint8_t b)
    : width(w), height(h), rgb(size_t(w) * size_t(h) * 3) {
  for (size_t i = 0; i < rgb.size(); i += 3) {
    rgb[i] = r;
    rgb[i + 1] = g;
    rgb[i + 2] = b;
  }
}

void RgbImage::set(int x, int y, uint8_t r, uint8_t g, uint8_t b) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  uint8_t* p = &rgb[(size_t(y) * size_t(width) + size_t(x)) * 3];
  p[0] = r;
  p[1] = g;
  p[2] = b;
}

uint32_t crc32_iso(const uint8_t* data, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

namespace {
void put32(std::string& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(char((v >> s) & 0xFF));
}
void chunk(std::string& out, const char* type, const std::string& data) {
  put32(out, uint32_t(data.size()));
  std::string body(type, 4);
  body += data;
  out += body;
  put32(out, crc32_iso(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
}
}  // namespace

void write_png(const std::string& path, const RgbImage& img) {
  AMPIPE_CHECK(img.width > 0 && img.height > 0 && img.rgb.size() == size_t(img.width) * size_t(img.height) * 3,
               "png of {} x {}", img.width, img.height);
  // The raw scanlines: filter byte 0 (None), then the row.
  std::string raw;
  raw.reserve(size_t(img.height) * (size_t(img.width) * 3 + 1));
  for (int y = 0; y < img.height; ++y) {
    raw.push_back(0);
    raw.append(reinterpret_cast<const char*>(&img.rgb[size_t(y) * size_t(img.width) * 3]), size_t(img.width) * 3);
  }
  // zlib stream of stored deflate blocks (at most 65535 bytes each), Adler-32 at the end.
  std::string z = {char(0x78), char(0x01)};
  for (size_t at = 0; at < raw.size() || raw.empty(); at += 65535) {
    const size_t n = std::min<size_t>(65535, raw.size() - at);
    const bool last = at + n >= raw.size();
    z.push_back(char(last ? 1 : 0));
    z.push_back(char(n & 0xFF));
    z.push_back(char(n >> 8));
    z.push_back(char(~n & 0xFF));
    z.push_back(char((~n >> 8) & 0xFF));
    z.append(raw, at, n);
    if (last) break;
  }
  uint32_t a = 1, b = 0;
  for (unsigned char c : raw) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  put32(z, (b << 16) | a);
  std::string ihdr;
  put32(ihdr, uint32_t(img.width));
  put32(ihdr, uint32_t(img.height));
  ihdr += std::string{char(8), char(2), char(0), char(0), char(0)};  // 8-bit, RGB, deflate, adaptive, no interlace
  std::string png = "\x89PNG\r\n\x1a\n";
  chunk(png, "IHDR", ihdr);
  chunk(png, "IDAT", z);
  chunk(png, "IEND", "");
  write_file_atomic(path, png);
}

}  // namespace ampipe::core
