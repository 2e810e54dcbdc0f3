// CRC-32C (Castagnoli), as in iSCSI, ext4 and PostgreSQL's WAL: the event log's frame checksum.
// SSE4.2's crc32 instruction when the CPU has it (8 bytes per instruction), a table otherwise;
// both give the same value.
#pragma once

#include <cstdint>
#include <string_view>

namespace walgate::protocol {

/// CRC-32C of data, continuing from crc (0 to start).
std::uint32_t crc32c(std::string_view data, std::uint32_t crc = 0);
/// The table version, always (for tests that compare the two).
std::uint32_t crc32c_portable(std::string_view data, std::uint32_t crc = 0);

}  // namespace walgate::protocol
