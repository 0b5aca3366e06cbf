// The byte-level tokenizer: every byte of UTF-8 text is one token, shifted past three
// reserved ids. It needs no vocabulary file, so text samples train anywhere, and the
// same 259-entry vocabulary also covers the synthetic tokens of lengths-only files.
//
// Thread-safety: pure functions.
//
//   std::vector<Token> ids = byte_tokenize("Hi");   // {75, 108}
//   std::string text = byte_detokenize(ids);        // "Hi"
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dynapipe {

// int64 so that the runtime can hand token vectors to LibTorch (kLong) without a copy.
using Token = std::int64_t;

inline constexpr Token kPadToken = 0;
inline constexpr Token kBosToken = 1;
inline constexpr Token kEosToken = 2;
inline constexpr Token kByteTokenOffset = 3;      // token = byte + kByteTokenOffset
inline constexpr std::int64_t kByteVocabSize = 259;  // 3 reserved + 256 bytes

// One token per byte of `text`, in order. Never fails.
std::vector<Token> byte_tokenize(std::string_view text);

// Inverse of byte_tokenize. Throws Error(InvalidArgument) on a reserved or out-of-range
// token, naming its position.
std::string byte_detokenize(std::span<const Token> tokens);

}  // namespace dynapipe
