// The TcpStore wire format (common/net/tcp_store.h describes the protocol),
// shared by the client, the server's protocol engine
// (common/net/tcp_store_server_core.h) and the store-frame fuzzer. Integers are
// little-endian; a string is u32 length + bytes; a frame is u32 length +
// payload.
#pragma once

#include <cstdint>
#include <string>

#include "common/net/store_auth.h"

namespace tessera::store_wire {

enum Op : uint8_t { kOpSet = 1, kOpGet = 2, kOpWait = 3, kOpAdd = 4, kOpAuth = 16 };
enum Result : uint8_t { kResultOk = 0, kResultTimeout = 1, kResultError = 2 };

// The largest frame before authentication: the server's challenge, the
// client's AUTH (identity up to kMaxIdentityBytes) and the server's answer.
inline constexpr uint32_t kMaxHandshakeFrameBytes = 512;
inline constexpr size_t kMaxIdentityBytes = 128;

// Domain-separation labels of the handshake's HMACs.
inline constexpr char kAuthLabel[] = "tessera-store-v1 auth";
inline constexpr char kServerProofLabel[] = "tessera-store-v1 server";
inline constexpr char kSessionLabel[] = "tessera-store-v1 session";
// Direction bytes of the per-frame tags.
inline constexpr char kClientToServer = 'C';
inline constexpr char kServerToClient = 'S';

inline void PutU8(std::string* out, uint8_t v) { out->push_back(static_cast<char>(v)); }
inline void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void PutStr(std::string* out, const std::string& s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}
inline std::string Frame(const std::string& payload) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(payload.size()));
  out.append(payload);
  return out;
}
inline uint32_t DecodeU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

// The client's AUTH proof: HMAC(key, label || server_nonce || client_nonce ||
// identity).
inline std::string AuthMac(const std::string& key, const std::string& server_nonce,
                           const std::string& client_nonce, const std::string& identity) {
  return HmacSha256(key, std::string(kAuthLabel) + server_nonce + client_nonce + identity);
}
inline std::string ServerProof(const std::string& key, const std::string& server_nonce,
                               const std::string& client_nonce) {
  return HmacSha256(key, std::string(kServerProofLabel) + server_nonce + client_nonce);
}
inline std::string SessionKey(const std::string& key, const std::string& server_nonce,
                              const std::string& client_nonce) {
  return HmacSha256(key, std::string(kSessionLabel) + server_nonce + client_nonce);
}
// Tag of the `seq`-th frame body sent in `direction` on a session.
inline std::string FrameTag(const std::string& session_key, char direction, uint64_t seq,
                            const std::string& body) {
  std::string m(1, direction);
  PutU64(&m, seq);
  m += body;
  return HmacSha256(session_key, m);
}

// Reads fields from a payload; every getter returns false past the end.
class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}
  bool U8(uint8_t* v) {
    if (pos_ + 1 > data_.size()) return false;
    *v = static_cast<uint8_t>(data_[pos_++]);
    return true;
  }
  bool U32(uint32_t* v) {
    if (data_.size() - pos_ < 4) return false;
    *v = DecodeU32(data_.data() + pos_);
    pos_ += 4;
    return true;
  }
  bool U64(uint64_t* v) {
    if (data_.size() - pos_ < 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) *v |= uint64_t{static_cast<uint8_t>(data_[pos_ + i])} << (8 * i);
    pos_ += 8;
    return true;
  }
  bool Str(std::string* s) {
    uint32_t n;
    if (!U32(&n) || data_.size() - pos_ < n) return false;
    s->assign(data_, pos_, n);
    pos_ += n;
    return true;
  }
  bool Bytes(size_t n, std::string* s) {
    if (data_.size() - pos_ < n) return false;
    s->assign(data_, pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == data_.size(); }

 private:
  const std::string& data_;
  size_t pos_ = 0;
};

}  // namespace tessera::store_wire
