// The wire format of the job's rendezvous store (store_server.h, store_client.h): length-
// prefixed frames of little-endian fields. Private to runtime/; no LibTorch.
//
//   frame    = u32 body length, body
//   request  = u8 op, fields of the op (below)
//   response = u8 status, fields of the op when status is Ok
//
//   op          request fields                   response fields
//   Set         key, value                       -
//   Get         key, i64 timeout ms              value        (waits until the key exists)
//   Add         key, i64 delta                   i64 new value (stored as decimal text)
//   Check       u32 n, n keys                    u8 all exist
//   Erase       key                              u8 existed
//   NumKeys     -                                i64 count
//   Wait        u32 n, n keys, i64 timeout ms    -            (until every key exists)
//   CompareSet  key, expected, desired           value now stored (c10d's semantics)
//
// Strings are u32 length + bytes. A Get or Wait that times out answers status Timeout.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dynapipe::runtime::store_wire {

enum class Op : std::uint8_t { Set, Get, Add, Check, Erase, NumKeys, Wait, CompareSet };
inline constexpr std::uint8_t kLastOp = static_cast<std::uint8_t>(Op::CompareSet);
enum class Status : std::uint8_t { Ok, Timeout };

// Frames larger than this are refused: a garbled length must not allocate the machine.
inline constexpr std::uint32_t kMaxFrameBytes = 1u << 30;

class Writer {
 public:
  Writer& u8(std::uint8_t v) {
    body_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) body_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& i64(std::int64_t v) {
    auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) body_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& str(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    body_.append(s);
    return *this;
  }
  // The body with its length prefix, ready to send.
  std::string frame() const {
    std::string out;
    const auto n = static_cast<std::uint32_t>(body_.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    return out + body_;
  }

 private:
  std::string body_;
};

// Reads fields from one frame body; every read returns nullopt past the end, so a short
// or garbled frame is detected, never read beyond.
class Reader {
 public:
  explicit Reader(std::string_view body) : body_(body) {}
  std::optional<std::uint8_t> u8() {
    if (body_.size() - pos_ < 1) return std::nullopt;
    return static_cast<std::uint8_t>(body_[pos_++]);
  }
  std::optional<std::uint32_t> u32() {
    if (body_.size() - pos_ < 4) return std::nullopt;
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t(static_cast<std::uint8_t>(body_[pos_++])) << (8 * i);
    return v;
  }
  std::optional<std::int64_t> i64() {
    if (body_.size() - pos_ < 8) return std::nullopt;
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t(static_cast<std::uint8_t>(body_[pos_++])) << (8 * i);
    return static_cast<std::int64_t>(v);
  }
  std::optional<std::string> str() {
    auto n = u32();
    if (!n || body_.size() - pos_ < *n) return std::nullopt;
    std::string s(body_.substr(pos_, *n));
    pos_ += *n;
    return s;
  }
  bool done() const { return pos_ == body_.size(); }

 private:
  std::string_view body_;
  std::size_t pos_ = 0;
};

// The body length a frame's 4-byte prefix announces (`buffer` holds at least 4 bytes).
inline std::uint32_t frame_length(std::string_view buffer) {
  std::uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= std::uint32_t(static_cast<std::uint8_t>(buffer[i])) << (8 * i);
  return n;
}

// The length of the frame at the start of `buffer` if it is complete (prefix included).
inline std::optional<std::size_t> complete_frame(std::string_view buffer) {
  if (buffer.size() < 4) return std::nullopt;
  const std::uint32_t n = frame_length(buffer);
  if (buffer.size() - 4 < n) return std::nullopt;
  return std::size_t{4} + n;
}

}  // namespace dynapipe::runtime::store_wire
