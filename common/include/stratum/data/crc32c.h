// CRC32C (Castagnoli), the checksum of TFRecord framing (and of iSCSI, ext4, LevelDB).
// Debian 12 packages no maintained CRC32C library for C++ (abseil's crc arrived after its
// 20220623), so this is Stratum's own: the SSE4.2 instruction where the CPU has it, else
// slicing-by-8 tables; both are tested against RFC 3720's vectors and each other.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stratum {

// The CRC32C of `size` bytes continuing `crc` (0 to start).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);
inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

// TFRecord stores CRCs masked (rotated and offset), so that a CRC of data holding CRCs
// does not degenerate.
inline uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

namespace crc32c_internal {
// The portable path alone, for tests that compare it with the hardware one.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size);
}  // namespace crc32c_internal

}  // namespace stratum
