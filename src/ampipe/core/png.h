// A minimal PNG writer: 8-bit RGB, one IDAT of stored (uncompressed) deflate blocks, so it needs no zlib. For small
// pictures (a loss plot); a 800 x 500 image is 1.2 MB.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ampipe::core {

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes per pixel
  RgbImage(int w, int h, uint8_t r = 255, uint8_t g = 255, uint8_t b = 255);
  void set(int x, int y, uint8_t r, uint8_t g, uint8_t b);  // ignored outside the image
};

// CRC-32 (ISO-HDLC, as PNG and zlib use) of bytes, continuing from `crc` (0 to start).
uint32_t crc32_iso(const uint8_t* data, size_t n, uint32_t crc = 0);
// Writes `img` as a PNG file (atomically: temporary file, then rename). Throws ConfigError naming `path` when it
// cannot be written.
void write_png(const std::string& path, const RgbImage& img);

}  // namespace ampipe::core
