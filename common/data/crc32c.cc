#include "stratum/data/crc32c.h"

#include <array>
#include <cstring>

namespace stratum {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78u;  // CRC32C, bit-reversed

using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables MakeTables() {
  Tables tables{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) != 0 ? kPolynomial : 0u);
    tables[0][i] = crc;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (size_t t = 1; t < 8; ++t) {
      tables[t][i] = (tables[t - 1][i] >> 8) ^ tables[0][tables[t - 1][i] & 0xffu];
    }
  }
  return tables;
}

constexpr Tables kTables = MakeTables();

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cSse42(uint32_t crc, const uint8_t* p,
                                                       size_t size) {
  uint64_t state = ~crc;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    state = __builtin_ia32_crc32di(state, word);
    p += 8;
    size -= 8;
  }
  auto state32 = static_cast<uint32_t>(state);
  while (size-- > 0) state32 = __builtin_ia32_crc32qi(state32, *p++);
  return ~state32;
}

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

namespace crc32c_internal {

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t state = ~crc;
  while (size >= 8) {
    uint32_t low;
    uint32_t high;
    std::memcpy(&low, p, 4);
    std::memcpy(&high, p + 4, 4);
    low ^= state;  // little-endian: the first byte is the lowest
    state = kTables[7][low & 0xffu] ^ kTables[6][(low >> 8) & 0xffu] ^
            kTables[5][(low >> 16) & 0xffu] ^ kTables[4][low >> 24] ^ kTables[3][high & 0xffu] ^
            kTables[2][(high >> 8) & 0xffu] ^ kTables[1][(high >> 16) & 0xffu] ^
            kTables[0][high >> 24];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) state = (state >> 8) ^ kTables[0][(state ^ *p++) & 0xffu];
  return ~state;
}

}  // namespace crc32c_internal

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  if (HasSse42()) return Crc32cSse42(crc, static_cast<const uint8_t*>(data), size);
#endif
  return crc32c_internal::Crc32cPortable(crc, data, size);
}

}  // namespace stratum
