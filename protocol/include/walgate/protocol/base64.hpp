// Base64 (RFC 4648, standard alphabet, with padding), used by SCRAM and by encoders.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace walgate::protocol {

std::string base64_encode(std::string_view in);
/// Appends the encoding of in to out (no allocation beyond out's growth).
void base64_encode_append(std::string& out, std::string_view in);
/// Strict decoding: padding required, no whitespace; nullopt on any invalid input.
std::optional<std::string> base64_decode(std::string_view in);
/// base64url (RFC 4648 section 5) without padding, as JWS (RFC 7515 section 2) uses it: strict
/// (no '=', no whitespace, no length of 1 mod 4, unused trailing bits zero); nullopt otherwise.
std::optional<std::string> base64url_decode(std::string_view in);
/// base64url without padding.
std::string base64url_encode(std::string_view in);

}  // namespace walgate::protocol
