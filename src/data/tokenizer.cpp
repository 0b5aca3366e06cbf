#include "dynapipe/data/tokenizer.h"

#include "dynapipe/core/error.h"

namespace dynapipe {

std::vector<Token> byte_tokenize(std::string_view text) {
  std::vector<Token> tokens;
  tokens.reserve(text.size());
  for (const char c : text) {
    tokens.push_back(static_cast<Token>(static_cast<unsigned char>(c)) + kByteTokenOffset);
  }
  return tokens;
}

std::string byte_detokenize(std::span<const Token> tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const Token token = tokens[i];
    if (token < kByteTokenOffset || token >= kByteVocabSize) {
      throw Error(ErrorKind::InvalidArgument,
                  cat("byte_detokenize: token ", i, " must be a byte token in [",
                      kByteTokenOffset, ", ", kByteVocabSize, "), got ", token));
    }
    text.push_back(static_cast<char>(token - kByteTokenOffset));
  }
  return text;
}

}  // namespace dynapipe
