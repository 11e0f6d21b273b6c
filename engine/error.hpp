#pragma once
// Errors of troupe's engine and of everything built on it.
//
// Three kinds:
//  - an expected failure (unknown key, wrong shape, lost peer, bad frame) is a value: `result<T>`
//    or `status`, returned to the caller, carrying an `error` whose message names the thing;
//  - a caller mistake on a plain operation (adding ndarrays of different shapes) throws
//    `troupe::exception`, which carries the same `error`;
//  - a bug is an assertion that prints the values.

#include <cstdint>
#include <ostream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace troupe {

/// What went wrong, coarsely; the message of `error` says what exactly.
enum class errc : std::uint8_t {
  invalid_argument = 1, ///< a value outside what the operation accepts
  unknown_key,          ///< a key that was never initialised
  already_initialized,  ///< init of a key that exists
  shape_mismatch,       ///< shape differs from the one declared or required
  dtype_mismatch,       ///< element type differs from the one declared or required
  context_mismatch,     ///< device context differs from the one required
  key_type_mix,         ///< int and string keys in one store
  empty_list,           ///< a list argument that must not be empty
  not_supported,        ///< an operation this mode or build does not offer
  device_unavailable,   ///< a context names a device that is not present
  io_error,             ///< a file could not be read or written
  corrupt_data,         ///< a file or buffer whose contents do not parse
  malformed_message,    ///< a frame from the network that failed validation
  timeout,              ///< a bounded wait ran out
  peer_lost,            ///< a node of the job is gone
  internal,             ///< a bug: please report it
};

/// The stable lower-case name of a code ("unknown_key").
std::string_view to_string(errc code) noexcept;

inline std::ostream& operator<<(std::ostream& out, errc code) {
  return out << to_string(code);
}

/// An error value: a code and a message that names the key, shape, file... that is wrong.
class error {
public:
  error(errc code, std::string message) : code_(code), message_(std::move(message)) {}

  errc code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  /// "unknown_key: key 3 was never initialised".
  std::string to_string() const;

  friend bool operator==(const error&, const error&) = default;

private:
  errc code_;
  std::string message_;
};

/// Thrown for caller mistakes on plain operations; what() is error().to_string().
class exception : public std::runtime_error {
public:
  explicit exception(troupe::error err)
      : std::runtime_error(err.to_string()), error_(std::move(err)) {}
  exception(errc code, std::string message) : exception(troupe::error{code, std::move(message)}) {}
  const troupe::error& error() const noexcept { return error_; }

private:
  troupe::error error_;
};

/// Either a T or an error (std::expected arrives with C++23; this is the part troupe uses).
template <class T>
class [[nodiscard]] result {
public:
  result(T value) : state_(std::in_place_index<0>, std::move(value)) {}
  result(troupe::error err) : state_(std::in_place_index<1>, std::move(err)) {}

  bool has_value() const noexcept { return state_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  /// The value; throws troupe::exception carrying the error when there is none.
  T& value() & {
    throw_if_error();
    return std::get<0>(state_);
  }
  const T& value() const& {
    throw_if_error();
    return std::get<0>(state_);
  }
  T&& value() && {
    throw_if_error();
    return std::get<0>(std::move(state_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// Precondition: !has_value().
  const troupe::error& error() const& { return std::get<1>(state_); }

private:
  void throw_if_error() const {
    if (state_.index() == 1)
      throw exception(std::get<1>(state_));
  }
  std::variant<T, troupe::error> state_;
};

/// Success or an error.
template <>
class [[nodiscard]] result<void> {
public:
  result() = default;
  result(troupe::error err) : error_(std::move(err)), failed_(true) {}

  bool has_value() const noexcept { return !failed_; }
  explicit operator bool() const noexcept { return !failed_; }
  /// Throws troupe::exception carrying the error, if any.
  void value() const {
    if (failed_)
      throw exception(error_);
  }
  /// Precondition: !has_value().
  const troupe::error& error() const& { return error_; }

private:
  troupe::error error_{errc::internal, {}};
  bool failed_ = false;
};

using status = result<void>;

/// Success, for `return ok();` in functions returning `status`.
inline status ok() {
  return {};
}

/// Runs `body` (returning status) and turns an exception it throws into a status: a
/// troupe::exception into the error it carries, any other std::exception into errc::internal with
/// its what(). For interfaces that report failures as values (the KVStore, the Trainer) over
/// engine calls that throw on caller mistakes.
template <class Body>
status status_of(Body&& body) {
  try {
    return body();
  } catch (const exception& failure) {
    return failure.error();
  } catch (const std::exception& failure) {
    return troupe::error{errc::internal, failure.what()};
  }
}

} // namespace troupe
