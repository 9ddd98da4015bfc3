// Status and StatusOr: the error values that cross every component boundary.
//
// Recoverable failures (bad files, bad config keys, a dead peer rank) are
// returned as a Status, never thrown across a component, thread or daemon
// boundary. The message names the thing at fault: a file, a tensor, a config
// key with line:col, a rank. Invariant violations use TESSERA_CHECK and abort.
//
// Thread-safety: Status and StatusOr are values; distinct objects may be used
// from distinct threads freely, a shared const object may be read concurrently.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace tessera {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller passed something malformed (file, key, request field)
  kNotFound,         // a named thing (tensor, file, key) does not exist
  kOutOfRange,       // an offset, index or size lies outside its valid range
  kUnimplemented,    // a valid but unsupported value (architecture, dtype, rope type)
  kFailedPrecondition,
  kIoError,            // the operating system refused a read, write, mmap or socket call
  kDeadlineExceeded,   // a collective, receive or wait timed out
  kUnavailable,        // a peer (rank, worker) is gone
  kResourceExhausted,  // out of KV blocks, queue full
  kInternal,
  kDataLoss,  // a computation produced unusable numbers (NaN or inf logits)
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: config.json: key 'hidden_size' ...".
  std::string ToString() const;

  // Returns a copy whose message is "context: message", for adding where an
  // error passed through on its way up.
  Status WithContext(const std::string& context) const;

  // Marks a Status as deliberately unchecked (best-effort notifications).
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = Internal("StatusOr constructed from an OK status without a value");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace tessera

#define TESSERA_CONCAT_INNER(a, b) a##b
#define TESSERA_CONCAT(a, b) TESSERA_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` is not OK.
#define TESSERA_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::tessera::Status _tessera_st = (expr);    \
    if (!_tessera_st.ok()) return _tessera_st; \
  } while (0)

// Same, adding `context` (a std::string expression) in front of the message.
#define TESSERA_RETURN_IF_ERROR_CTX(expr, context)                  \
  do {                                                              \
    ::tessera::Status _tessera_st = (expr);                         \
    if (!_tessera_st.ok()) return _tessera_st.WithContext(context); \
  } while (0)

// `TESSERA_ASSIGN_OR_RETURN(auto x, Foo());` binds the value or returns the error.
#define TESSERA_ASSIGN_OR_RETURN(lhs, expr)                 \
  auto TESSERA_CONCAT(_tessera_so_, __LINE__) = (expr);     \
  if (!TESSERA_CONCAT(_tessera_so_, __LINE__).ok())         \
    return TESSERA_CONCAT(_tessera_so_, __LINE__).status(); \
  lhs = std::move(TESSERA_CONCAT(_tessera_so_, __LINE__)).value()

// Invariant check: aborts with file:line and the message. For programming
// errors only, never for bad input.
#define TESSERA_CHECK(cond)                                                                 \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: TESSERA_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)
