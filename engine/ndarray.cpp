#include "engine/ndarray.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <ostream>
#include <string_view>
#include <type_traits>
#include <utility>

#include "engine/autograd_state.hpp"
#include "engine/dispatch.hpp"
#include "engine/nd.hpp"
#include "engine/random.hpp"
#include "engine/storage.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/half.hpp"
#include "kernels/cpu/reduce.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/optimizer.hpp"

namespace troupe {

namespace {

namespace kcpu = kernels::cpu;
namespace kcuda = kernels::cuda;
using half_bits = kcpu::half_bits;

// ---------------------------------------------------------------------------------------------
// Element types. float16 elements are handled as their raw bits (std::uint16_t); the engine has no
// uint16 dtype, so half_bits in a template always means float16.

template <class T>
constexpr bool is_half = std::is_same_v<T, half_bits>;
template <class T>
constexpr bool is_float_like = std::is_floating_point_v<T> || is_half<T>;

/// Calls f(std::type_identity<T>{}) with T the host element type of `type`.
template <class F>
decltype(auto) visit_dtype(dtype type, F&& f) {
  switch (type) {
  case dtype::float32:
    return f(std::type_identity<float>{});
  case dtype::float16:
    return f(std::type_identity<half_bits>{});
  case dtype::int32:
    return f(std::type_identity<std::int32_t>{});
  case dtype::int64:
    return f(std::type_identity<std::int64_t>{});
  case dtype::float64:
    break;
  }
  return f(std::type_identity<double>{});
}

template <class T>
constexpr dtype dtype_of() {
  if constexpr (std::is_same_v<T, float>)
    return dtype::float32;
  else if constexpr (is_half<T>)
    return dtype::float16;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return dtype::int32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return dtype::int64;
  else
    return dtype::float64;
}

/// One element converted as numpy's astype does (float -> integer truncates toward zero), except
/// that float -> integer saturates and NaN gives 0 where C++ and numpy leave the result undefined.
/// float64 -> float16 rounds through float32 (kernels/cpu/half.hpp converts from float only),
/// which can differ from a direct rounding in the last bit for rare values.
template <class To, class From>
To convert_value(From value) noexcept {
  if constexpr (is_half<From>) {
    return convert_value<To>(kcpu::half_to_float(value));
  } else if constexpr (is_half<To>) {
    return kcpu::float_to_half(static_cast<float>(value));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    // Both bounds are powers of two, exact in every floating type.
    constexpr auto low = static_cast<From>(std::numeric_limits<To>::min());
    if (std::isnan(value))
      return 0;
    if (value <= low)
      return std::numeric_limits<To>::min();
    if (value >= -low)
      return std::numeric_limits<To>::max();
    return static_cast<To>(value);
  } else {
    return static_cast<To>(value);
  }
}

template <class T>
double to_double(T value) noexcept {
  return convert_value<double>(value);
}

// ---------------------------------------------------------------------------------------------
// Messages.

[[noreturn]] void fail(errc code, std::string_view operation, const std::string& message) {
  std::string text{operation};
  text += ": ";
  text += message;
  throw exception(code, std::move(text));
}

void require_handle(const ndarray& array, std::string_view operation) {
  if (array.is_none())
    fail(errc::invalid_argument, operation,
         "the ndarray is none (default-constructed, without storage)");
}

/// Throws unless ctx names a device this process has.
void require_available(context ctx, std::string_view operation) {
  if (auto available = check_available(ctx); !available)
    fail(available.error().code(), operation, available.error().message());
}

/// Same context and dtype, in that order; `what` prefixes the values ("input 2 ").
void require_same_kind(std::string_view operation, const ndarray& a, const ndarray& b,
                       const std::string& what = {}) {
  if (a.ctx() != b.ctx())
    fail(errc::context_mismatch, operation,
         what + "context " + a.ctx().to_string() + " does not match " + b.ctx().to_string());
  if (a.dtype() != b.dtype())
    fail(errc::dtype_mismatch, operation,
         what + "dtype " + std::string{to_string(a.dtype())} + " does not match " +
             std::string{to_string(b.dtype())});
}

[[noreturn]] void shape_mismatch(std::string_view operation, const shape_vector& a,
                                 const shape_vector& b, const std::string& what = {}) {
  fail(errc::shape_mismatch, operation,
       what + "shape " + shape_to_string(a) + " does not match " + shape_to_string(b));
}

/// Checks extents and that the byte count fits; returns the byte count.
std::size_t checked_nbytes(const shape_vector& shape, dtype type, std::string_view operation) {
  std::int64_t count = 1;
  for (const auto extent : shape) {
    if (extent < 0)
      fail(errc::invalid_argument, operation,
           "shape " + shape_to_string(shape) + " has a negative extent");
    if (__builtin_mul_overflow(count, extent, &count))
      count = std::numeric_limits<std::int64_t>::max();
  }
  constexpr std::int64_t max_bytes = std::int64_t{1} << 60;
  if (count > max_bytes / static_cast<std::int64_t>(size_of(type)))
    fail(errc::invalid_argument, operation,
         "shape " + shape_to_string(shape) + " is too large for one array");
  return static_cast<std::size_t>(count) * size_of(type);
}

bool overlaps(const ndarray& a, const ndarray& b) {
  if (!a.shares_storage_with(b))
    return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.raw_data());
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.raw_data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

// ---------------------------------------------------------------------------------------------
// Moving bytes and converting on the host.

void copy_bytes(void* dst, context dst_ctx, const void* src, context src_ctx, std::size_t bytes) {
  if (bytes == 0 || (dst == src && dst_ctx == src_ctx))
    return;
  if (dst_ctx.is_cpu() && src_ctx.is_cpu())
    std::memmove(dst, src, bytes); // views of one block may overlap
  else if (src_ctx.is_cpu())
    kcuda::copy_host_to_device(dst_ctx.id, dst, src, bytes);
  else if (dst_ctx.is_cpu())
    kcuda::copy_device_to_host(src_ctx.id, dst, src, bytes);
  else
    kcuda::copy_device_to_device(dst_ctx.id, dst, src_ctx.id, src, bytes);
}

void host_convert(dtype from, const void* in, dtype to, void* out, std::size_t n) {
  if (n == 0)
    return;
  if (from == to) {
    std::memmove(out, in, n * size_of(to));
    return;
  }
  if (from == dtype::float32 && to == dtype::float16) {
    kcpu::float_to_half(static_cast<const float*>(in), static_cast<half_bits*>(out), n);
    return;
  }
  if (from == dtype::float16 && to == dtype::float32) {
    kcpu::half_to_float(static_cast<const half_bits*>(in), static_cast<float*>(out), n);
    return;
  }
  visit_dtype(from, [&](auto from_tag) {
    using F = typename decltype(from_tag)::type;
    visit_dtype(to, [&](auto to_tag) {
      using T = typename decltype(to_tag)::type;
      const auto* src = static_cast<const F*>(in);
      auto* dst = static_cast<T*>(out);
      for (std::size_t i = 0; i < n; ++i)
        dst[i] = convert_value<T>(src[i]);
    });
  });
}

/// Host memory with the values of `array`: the array itself when it is on a cpu context.
ndarray on_host(const ndarray& array) {
  return array.ctx().is_cpu() ? array : array.copy_to(context::cpu());
}

// ---------------------------------------------------------------------------------------------
// Host arithmetic. float16 runs through float32 in chunks small enough for the stack, and each
// result is rounded to float16 once.

constexpr std::size_t half_chunk = 2048;

enum class binary_op { add, sub, mul, div };

std::string_view name_of(binary_op op) {
  switch (op) {
  case binary_op::add:
    return "add";
  case binary_op::sub:
    return "sub";
  case binary_op::mul:
    return "mul";
  case binary_op::div:
    return "div";
  }
  return "?";
}

template <class T>
void typed_binary(binary_op op, const T* a, const T* b, T* out, std::size_t n) {
  switch (op) {
  case binary_op::add:
    kcpu::add(a, b, out, n);
    return;
  case binary_op::sub:
    kcpu::sub(a, b, out, n);
    return;
  case binary_op::mul:
    kcpu::mul(a, b, out, n);
    return;
  case binary_op::div:
    if constexpr (std::is_integral_v<T>) {
      const auto* zero = std::find(b, b + n, T{0});
      if (zero != b + n)
        fail(errc::invalid_argument, "div",
             "integer division by zero (element " + std::to_string(zero - b) + " of the divisor)");
    }
    kcpu::div(a, b, out, n);
    return;
  }
}

void host_binary(binary_op op, dtype type, const void* a, const void* b, void* out, std::size_t n) {
  visit_dtype(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_half<T>) {
      const auto* ha = static_cast<const half_bits*>(a);
      const auto* hb = static_cast<const half_bits*>(b);
      auto* ho = static_cast<half_bits*>(out);
      std::array<float, half_chunk> fa;
      std::array<float, half_chunk> fb;
      for (std::size_t i = 0; i < n; i += half_chunk) {
        const std::size_t m = std::min(half_chunk, n - i);
        kcpu::half_to_float(ha + i, fa.data(), m);
        kcpu::half_to_float(hb + i, fb.data(), m);
        typed_binary(op, fa.data(), fb.data(), fa.data(), m);
        kcpu::float_to_half(fa.data(), ho + i, m);
      }
    } else {
      typed_binary(op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n);
    }
  });
}

/// Operations with a double operand; x - v is x + (-v), exact in IEEE arithmetic.
enum class scalar_op { add, mul, div };

template <class T>
void typed_scalar(scalar_op op, const T* x, T value, T* out, std::size_t n, double original) {
  switch (op) {
  case scalar_op::add:
    kcpu::add_scalar(x, value, out, n);
    return;
  case scalar_op::mul:
    kcpu::scale(x, value, out, n);
    return;
  case scalar_op::div:
    if constexpr (std::is_integral_v<T>) {
      if (value == 0)
        fail(errc::invalid_argument, "div",
             "integer division by zero (the divisor " + number_text(original) + " converts to 0)");
    }
    for (std::size_t i = 0; i < n; ++i)
      out[i] = x[i] / value;
    return;
  }
}

/// The scalar is first converted to the array's dtype (as MXNet's scalar operators do: an int32
/// array times 0.5 is multiplied by 0).
void host_scalar(scalar_op op, dtype type, const void* x, double value, void* out, std::size_t n) {
  visit_dtype(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_half<T>) {
      const float v = kcpu::half_to_float(kcpu::float_to_half(static_cast<float>(value)));
      const auto* hx = static_cast<const half_bits*>(x);
      auto* ho = static_cast<half_bits*>(out);
      std::array<float, half_chunk> fx;
      for (std::size_t i = 0; i < n; i += half_chunk) {
        const std::size_t m = std::min(half_chunk, n - i);
        kcpu::half_to_float(hx + i, fx.data(), m);
        typed_scalar(op, fx.data(), v, fx.data(), m, value);
        kcpu::float_to_half(fx.data(), ho + i, m);
      }
    } else {
      typed_scalar(op, static_cast<const T*>(x), convert_value<T>(value), static_cast<T*>(out), n,
                   value);
    }
  });
}

void host_fill(dtype type, void* out, double value, std::size_t n) {
  visit_dtype(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_half<T>)
      std::fill_n(static_cast<half_bits*>(out), n, kcpu::float_to_half(static_cast<float>(value)));
    else
      kcpu::fill(static_cast<T*>(out), convert_value<T>(value), n);
  });
}

void host_axpy(dtype type, double alpha, const void* x, void* y, std::size_t n) {
  visit_dtype(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_half<T>) {
      const auto* hx = static_cast<const half_bits*>(x);
      auto* hy = static_cast<half_bits*>(y);
      std::array<float, half_chunk> fx;
      std::array<float, half_chunk> fy;
      for (std::size_t i = 0; i < n; i += half_chunk) {
        const std::size_t m = std::min(half_chunk, n - i);
        kcpu::half_to_float(hx + i, fx.data(), m);
        kcpu::half_to_float(hy + i, fy.data(), m);
        kcpu::axpy(static_cast<float>(alpha), fx.data(), fy.data(), m);
        kcpu::float_to_half(fy.data(), hy + i, m);
      }
    } else {
      kcpu::axpy(convert_value<T>(alpha), static_cast<const T*>(x), static_cast<T*>(y), n);
    }
  });
}

void host_sum_n(dtype type, std::span<const ndarray> inputs, void* out, std::size_t n) {
  visit_dtype(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<const T*> pointers;
    pointers.reserve(inputs.size());
    for (const auto& input : inputs)
      pointers.push_back(static_cast<const T*>(input.raw_data()));
    if constexpr (is_half<T>)
      kcpu::sum_n_half(pointers.data(), pointers.size(), static_cast<half_bits*>(out), n);
    else
      kcpu::sum_n(pointers.data(), pointers.size(), static_cast<T*>(out), n);
  });
}

double host_sum(dtype type, const void* data, std::size_t n) {
  return visit_dtype(type, [&](auto tag) -> double {
    using T = typename decltype(tag)::type;
    const auto* x = static_cast<const T*>(data);
    if constexpr (std::is_floating_point_v<T>) {
      return kcpu::sum(x, n);
    } else {
      double total = 0.0;
      for (std::size_t i = 0; i < n; ++i)
        total += to_double(x[i]);
      return total;
    }
  });
}

double host_l2_norm(dtype type, const void* data, std::size_t n) {
  return visit_dtype(type, [&](auto tag) -> double {
    using T = typename decltype(tag)::type;
    const auto* x = static_cast<const T*>(data);
    if constexpr (std::is_floating_point_v<T>) {
      return kcpu::l2_norm(x, n);
    } else {
      double total = 0.0;
      for (std::size_t i = 0; i < n; ++i) {
        const double v = to_double(x[i]);
        total += v * v;
      }
      return std::sqrt(total);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Arithmetic on any context. gpu float32 runs on the CUDA kernels; what kernels/cuda does not
// offer (division, other dtypes) is computed on the host and copied back: correct, not fast.

/// out = a op b, all of one shape, dtype and context; out may be a or b.
void apply_binary(binary_op op, const ndarray& a, const ndarray& b, ndarray& out) {
  const auto n = static_cast<std::size_t>(out.size());
  if (n == 0)
    return;
  // The kernels let out be an input itself, not a view shifted against it
  // (a.slice(1, 4) += a.slice(0, 3)): such an input is copied first, as numpy does.
  if (overlaps(a, out) && a.raw_data() != out.raw_data()) {
    apply_binary(op, a.copy(), b, out);
    return;
  }
  if (overlaps(b, out) && b.raw_data() != out.raw_data()) {
    apply_binary(op, a, b.copy(), out);
    return;
  }
  const context ctx = out.ctx();
  if (ctx.is_cpu()) {
    host_binary(op, out.dtype(), a.raw_data(), b.raw_data(), out.raw_data(), n);
    return;
  }
  if (out.dtype() == dtype::float32 && op != binary_op::div) {
    const auto* pa = static_cast<const float*>(a.raw_data());
    const auto* pb = static_cast<const float*>(b.raw_data());
    auto* po = static_cast<float*>(out.raw_data());
    if (op == binary_op::add)
      kcuda::add(ctx.id, pa, pb, po, n);
    else if (op == binary_op::sub)
      kcuda::sub(ctx.id, pa, pb, po, n);
    else
      kcuda::mul(ctx.id, pa, pb, po, n);
    return;
  }
  ndarray ha = a.copy_to(context::cpu());
  const ndarray hb = on_host(b);
  host_binary(op, out.dtype(), ha.raw_data(), hb.raw_data(), ha.raw_data(), n);
  ha.copy_to(out);
}

void apply_scalar(scalar_op op, const ndarray& x, double value, ndarray& out) {
  const auto n = static_cast<std::size_t>(out.size());
  if (n == 0)
    return;
  const context ctx = out.ctx();
  if (ctx.is_cpu()) {
    host_scalar(op, out.dtype(), x.raw_data(), value, out.raw_data(), n);
    return;
  }
  if (out.dtype() == dtype::float32 && op != scalar_op::div) {
    const auto* px = static_cast<const float*>(x.raw_data());
    auto* po = static_cast<float*>(out.raw_data());
    if (op == scalar_op::mul) {
      kcuda::scale(ctx.id, px, static_cast<float>(value), po, n);
    } else {
      // kernels/cuda has no add_scalar: add a pooled array filled with the value.
      ndarray filled = ndarray::full(out.shape(), value, ctx, dtype::float32);
      kcuda::add(ctx.id, px, static_cast<const float*>(filled.raw_data()), po, n);
    }
    return;
  }
  ndarray hx = x.copy_to(context::cpu());
  host_scalar(op, out.dtype(), hx.raw_data(), value, hx.raw_data(), n);
  hx.copy_to(out);
}

/// A `shape` array whose every element is the single element of `one`, copied bit for bit (so
/// int64 values do not pass through double).
ndarray broadcast_one(const ndarray& one, const shape_vector& shape) {
  ndarray out(shape, one.ctx(), one.dtype());
  const auto n = static_cast<std::size_t>(out.size());
  if (n == 0)
    return out;
  const ndarray source = on_host(one);
  ndarray host = out.ctx().is_cpu() ? out : ndarray(shape, context::cpu(), one.dtype());
  const std::size_t width = size_of(one.dtype());
  const auto* element = static_cast<const unsigned char*>(source.raw_data());
  auto* dst = static_cast<unsigned char*>(host.raw_data());
  for (std::size_t i = 0; i < n; ++i)
    std::memcpy(dst + i * width, element, width);
  if (!out.ctx().is_cpu())
    host.copy_to(out);
  return out;
}

/// Queues out = lhs op rhs on out's context, a one-element side broadcast to the other's shape
/// (out has that shape; it may be lhs itself).
void queue_binary(binary_op op, const ndarray& lhs, const ndarray& rhs, ndarray& out) {
  engine::push(name_of(op), out.ctx(), {.reads = {&lhs, &rhs}, .writes = {&out}},
               [op, lhs, rhs, out]() mutable {
                 if (lhs.shape() == rhs.shape())
                   apply_binary(op, lhs, rhs, out);
                 else if (rhs.size() == 1)
                   apply_binary(op, lhs, broadcast_one(rhs, out.shape()), out);
                 else
                   apply_binary(op, broadcast_one(lhs, out.shape()), rhs, out);
               });
}

ndarray binary_result(binary_op op, const ndarray& lhs, const ndarray& rhs) {
  const auto name = name_of(op);
  require_handle(lhs, name);
  require_handle(rhs, name);
  require_same_kind(name, lhs, rhs);
  if (lhs.shape() != rhs.shape() && rhs.size() != 1 && lhs.size() != 1)
    shape_mismatch(name, lhs.shape(), rhs.shape());
  const auto& shape = lhs.shape() == rhs.shape() || rhs.size() == 1 ? lhs.shape() : rhs.shape();
  ndarray out(shape, lhs.ctx(), lhs.dtype());
  queue_binary(op, lhs, rhs, out);
  return out;
}

void binary_in_place(binary_op op, ndarray& self, const ndarray& rhs) {
  const auto name = name_of(op);
  require_handle(self, name);
  require_handle(rhs, name);
  require_same_kind(name, self, rhs);
  if (self.shape() != rhs.shape() && rhs.size() != 1)
    shape_mismatch(name, self.shape(), rhs.shape());
  queue_binary(op, self, rhs, self);
}

void queue_scalar(scalar_op op, std::string_view name, const ndarray& x, double value,
                  ndarray& out) {
  engine::push(name, out.ctx(), {.reads = {&x}, .writes = {&out}},
               [op, x, value, out]() mutable { apply_scalar(op, x, value, out); });
}

ndarray scalar_result(scalar_op op, std::string_view name, const ndarray& x, double value) {
  require_handle(x, name);
  ndarray out(x.shape(), x.ctx(), x.dtype());
  queue_scalar(op, name, x, value, out);
  return out;
}

void scalar_in_place(scalar_op op, std::string_view name, ndarray& self, double value) {
  require_handle(self, name);
  queue_scalar(op, name, self, value, self);
}

// ---------------------------------------------------------------------------------------------
// Random sampling: generated on the host in double from random_generator, converted to the dtype,
// then copied to the context, so the values do not depend on the context.

void require_float_dtype(dtype type, std::string_view operation) {
  if (type == dtype::int32 || type == dtype::int64)
    fail(errc::not_supported, operation,
         "dtype " + std::string{to_string(type)} +
             " is not supported (float16, float32 and float64 only, as in MXNet)");
}

/// The largest value of T below `value`.
template <class T>
T next_below(T value) noexcept {
  if constexpr (is_half<T>) {
    const bool negative = (value & 0x8000u) != 0;
    if ((value & 0x7fffu) == 0)
      return 0x8001u; // below ±0: the smallest negative subnormal
    return negative ? static_cast<half_bits>(value + 1) : static_cast<half_bits>(value - 1);
  } else {
    return std::nextafter(value, -std::numeric_limits<T>::infinity());
  }
}

template <class Sample>
ndarray sample(shape_vector shape, context ctx, dtype type, std::string_view operation,
               Sample&& next) {
  require_float_dtype(type, operation);
  require_available(ctx, operation);
  ndarray out(std::move(shape), ctx, type);
  ndarray host = ctx.is_cpu() ? out : ndarray(out.shape(), context::cpu(), type);
  const auto n = static_cast<std::size_t>(out.size());
  visit_dtype(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_float_like<T>) {
      auto* dst = static_cast<T*>(host.raw_data());
      for (std::size_t i = 0; i < n; ++i)
        dst[i] = next.template operator()<T>();
    }
  });
  if (!ctx.is_cpu())
    host.copy_to(out);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Printing as numpy 1.x's str() with its default options (precision 8, floatmode "maxprec",
// linewidth 75, threshold 1000, edgeitems 3), which is what MXNet's NDArray repr shows; checked
// against numpy 1.26 on 23,000 random arrays of every dtype and magnitude.

constexpr int print_precision = 8;
constexpr std::size_t print_line_width = 75;
constexpr std::int64_t print_threshold = 1000;
constexpr std::int64_t print_edge_items = 3;

template <class T>
bool round_trips(std::string_view text, T value) {
  if constexpr (std::is_same_v<T, double>) {
    double parsed = 0;
    std::from_chars(text.data(), text.data() + text.size(), parsed);
    return parsed == value;
  } else {
    float parsed = 0;
    std::from_chars(text.data(), text.data() + text.size(), parsed);
    if constexpr (is_half<T>)
      return kcpu::float_to_half(parsed) == value;
    else
      return parsed == value;
  }
}

std::string chars(double value, std::chars_format format, int precision) {
  std::array<char, 400> buffer{};
  const auto result =
      std::to_chars(buffer.data(), buffer.data() + buffer.size(), value, format, precision);
  return {buffer.data(), result.ptr};
}

/// `value` rounded to `digits` digits after the point (or after the first digit in scientific
/// form), trailing zeros dropped.
std::string rounded_digits(double value, std::chars_format format, int digits) {
  const auto text = chars(value, format, digits);
  const auto exponent = text.find('e');
  std::string tail = exponent == std::string::npos ? std::string{} : text.substr(exponent);
  std::string mantissa = text.substr(0, exponent);
  if (mantissa.find('.') != std::string::npos) {
    while (mantissa.back() == '0')
      mantissa.pop_back();
    if (mantissa.back() == '.')
      mantissa.pop_back();
  }
  return mantissa + tail;
}

/// The fewest significant digits that read back as `value`, in scientific form ("1.2145303e+08").
template <class T>
std::string unique_scientific(T value) {
  const double d = to_double(value);
  std::string text;
  // 17 significant digits identify any double, fewer any float or half.
  for (int digits = 0; digits <= 16; ++digits) {
    text = chars(d, std::chars_format::scientific, digits);
    if (round_trips<T>(text, value))
      break;
  }
  return text;
}

/// numpy's dragon4 with unique=True and trim='.': the fewest significant digits that read back
/// as `value`, in scientific or positional form; when they would need more than `max_digits`
/// digits after the point (after the first digit in scientific form), `value` rounded to
/// `max_digits` digits, trailing zeros dropped. Positionally, digits that end before the point
/// are either followed by zeros (`exact_integer` false, numpy's scalar str: float32 121453032 is
/// "121453030") or the integer part is written exactly (true, numpy's arrays, which pass
/// min_digits=0: "121453032").
template <class T>
std::string shortest_digits(T value, std::chars_format format, int max_digits,
                            bool exact_integer = true) {
  const double d = to_double(value);
  const std::string unique = unique_scientific(value);
  const auto e = unique.find('e');
  std::string digits;
  for (const char c : unique.substr(0, e))
    if (c >= '0' && c <= '9')
      digits += c;
  const int exponent = std::stoi(unique.substr(e + 1));
  const int fraction_digits = format == std::chars_format::scientific
                                  ? static_cast<int>(digits.size()) - 1
                                  : std::max(0, static_cast<int>(digits.size()) - 1 - exponent);
  if (fraction_digits > max_digits)
    return rounded_digits(d, format, max_digits);
  if (format == std::chars_format::scientific)
    return unique;
  if (exact_integer && fraction_digits == 0)
    return chars(d, std::chars_format::fixed, 0);
  std::string text = std::signbit(d) ? "-" : "";
  if (exponent >= 0) {
    const auto integer_digits = static_cast<std::size_t>(exponent) + 1;
    if (digits.size() < integer_digits)
      digits.append(integer_digits - digits.size(), '0');
    text += digits.substr(0, integer_digits);
    if (digits.size() > integer_digits)
      text += '.' + digits.substr(integer_digits);
  } else {
    text += "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
  }
  return text;
}

struct float_parts {
  std::string integer;  ///< with its sign
  std::string fraction; ///< digits after the point (may be empty)
  std::string exponent; ///< sign and digits ("-05"), scientific form only
};

float_parts split_float(const std::string& text) {
  float_parts parts;
  const auto e = text.find('e');
  const std::string mantissa = text.substr(0, e);
  if (e != std::string::npos)
    parts.exponent = text.substr(e + 1);
  const auto point = mantissa.find('.');
  parts.integer = mantissa.substr(0, point);
  if (point != std::string::npos)
    parts.fraction = mantissa.substr(point + 1);
  return parts;
}

/// numpy's FloatingFormat: one layout for all printed elements of an array.
template <class T>
class float_formatter {
public:
  explicit float_formatter(const std::vector<T>& shown) {
    std::vector<T> finite;
    bool any_non_finite = false;
    bool negative_infinity = false;
    for (const T value : shown) {
      const double d = to_double(value);
      if (std::isfinite(d)) {
        finite.push_back(value);
      } else {
        any_non_finite = true;
        negative_infinity = negative_infinity || (std::isinf(d) && d < 0);
      }
    }
    double max_abs = 0.0;
    double min_abs = std::numeric_limits<double>::infinity();
    for (const T value : finite) {
      const double magnitude = std::fabs(to_double(value));
      if (magnitude != 0.0) {
        max_abs = std::max(max_abs, magnitude);
        min_abs = std::min(min_abs, magnitude);
      }
    }
    // numpy 1.x's rule for every dtype (numpy >= 2.3 lowers the 1e8 for float16 and float32).
    if (max_abs > 0.0)
      exponential_ = max_abs >= 1e8 || min_abs < 1e-4 || max_abs / min_abs > 1000.0;

    std::size_t fraction_width = 0;
    std::size_t exponent_width = 0;
    for (const T value : finite) {
      const auto parts = split_float(shortest_digits(
          value, exponential_ ? std::chars_format::scientific : std::chars_format::fixed,
          print_precision));
      pad_left_ = std::max(pad_left_, parts.integer.size());
      fraction_width = std::max(fraction_width, parts.fraction.size());
      exponent_width = std::max(exponent_width, parts.exponent.size());
    }
    if (exponential_) {
      exponent_digits_ = exponent_width == 0 ? 0 : exponent_width - 1;
      precision_ = fraction_width;
      pad_right_ = exponent_digits_ + 2 + precision_;
    } else {
      pad_right_ = fraction_width;
    }
    if (any_non_finite) {
      const std::size_t offset = pad_right_ + 1;
      const std::size_t longest = negative_infinity ? 4 : 3; // "nan", "inf", "-inf"
      if (longest > offset)
        pad_left_ = std::max(pad_left_, longest - offset);
    }
  }

  std::string operator()(T value) const {
    const double d = to_double(value);
    if (!std::isfinite(d)) {
      const std::string text = std::isnan(d) ? "nan" : (d < 0 ? "-inf" : "inf");
      return pad(text, pad_left_ + pad_right_ + 1);
    }
    if (!exponential_) {
      const auto parts =
          split_float(shortest_digits(value, std::chars_format::fixed, print_precision));
      std::string text = pad(parts.integer, pad_left_) + '.' + parts.fraction;
      text.append(pad_right_ - parts.fraction.size(), ' ');
      return text;
    }
    // Every value shows `precision_` digits; past its own unique ones they are the value's true
    // digits, rounded (numpy's min_digits), not zeros.
    const auto parts =
        split_float(chars(d, std::chars_format::scientific, static_cast<int>(precision_)));
    std::string text = pad(parts.integer, pad_left_) + '.' + parts.fraction + 'e';
    text += parts.exponent.front();
    std::string digits = parts.exponent.substr(1);
    if (digits.size() < exponent_digits_)
      digits.insert(0, exponent_digits_ - digits.size(), '0');
    return text + digits;
  }

private:
  static std::string pad(const std::string& text, std::size_t width) {
    return text.size() >= width ? text : std::string(width - text.size(), ' ') + text;
  }

  bool exponential_ = false;
  std::size_t pad_left_ = 0;
  std::size_t pad_right_ = 0;
  std::size_t precision_ = 0;
  std::size_t exponent_digits_ = 0;
};

/// str() of a numpy scalar: shortest digits that read back, positional for 1e-4 <= |x| < 1e16
/// ("1.0", "0.5"), scientific otherwise ("1e-05").
template <class T>
std::string scalar_text(T value) {
  if constexpr (!is_float_like<T>) {
    return std::to_string(value);
  } else {
    const double d = to_double(value);
    if (std::isnan(d))
      return "nan";
    if (std::isinf(d))
      return d < 0 ? "-inf" : "inf";
    const double magnitude = std::fabs(d);
    if (magnitude == 0.0 || (magnitude >= 1e-4 && magnitude < 1e16)) {
      std::string text = shortest_digits(value, std::chars_format::fixed, 40, false);
      if (text.find('.') == std::string::npos)
        text += ".0";
      return text;
    }
    return shortest_digits(value, std::chars_format::scientific, 20);
  }
}

/// numpy's _formatArray: nested brackets, rows wrapped at the line width, "..." in place of the
/// middle of long axes when summarising.
class array_printer {
public:
  array_printer(const shape_vector& shape, bool summarize,
                std::function<std::string(std::int64_t)> element)
      : shape_(shape), summarize_(summarize), element_(std::move(element)),
        strides_(shape.size(), 1) {
    for (std::size_t axis = shape.size(); axis-- > 1;)
      strides_[axis - 1] = strides_[axis] * shape[axis];
  }

  std::string print() { return recurse(0, 0, " ", print_line_width); }

  /// Flat indices of the elements print() shows, in order.
  std::vector<std::int64_t> shown() const {
    std::vector<std::int64_t> indices;
    collect(0, 0, indices);
    return indices;
  }

private:
  bool summarized(std::size_t axis) const {
    return summarize_ && 2 * print_edge_items < shape_[axis];
  }

  void collect(std::size_t axis, std::int64_t offset, std::vector<std::int64_t>& out) const {
    if (axis == shape_.size()) {
      out.push_back(offset);
      return;
    }
    const std::int64_t extent = shape_[axis];
    for (std::int64_t i = 0; i < extent; ++i) {
      if (summarized(axis) && i == print_edge_items)
        i = extent - print_edge_items;
      collect(axis + 1, offset + i * strides_[axis], out);
    }
  }

  static void extend_line(std::string& text, std::string& line, const std::string& word,
                          std::size_t width, const std::string& prefix) {
    // Wrapping a line that holds only the prefix would not help.
    if (line.size() + word.size() > width && line.size() > prefix.size()) {
      while (!line.empty() && line.back() == ' ')
        line.pop_back();
      text += line;
      text += '\n';
      line = prefix;
    }
    line += word;
  }

  std::string recurse(std::size_t axis, std::int64_t offset, const std::string& indent,
                      std::size_t width) {
    if (axis == shape_.size())
      return element_(offset);
    const std::string next_indent = indent + ' ';
    const std::size_t next_width = width - 1; // room for the closing ']'
    const std::int64_t extent = shape_[axis];
    const bool summary = summarized(axis);
    const std::int64_t leading = summary ? print_edge_items : 0;
    const std::int64_t trailing = summary ? print_edge_items : extent;
    const std::int64_t stride = strides_[axis];
    const std::size_t axes_left = shape_.size() - axis;
    std::string text;
    if (axes_left == 1) {
      const std::size_t element_width = width - 1;
      std::string line = indent;
      for (std::int64_t i = 0; i < leading; ++i) {
        extend_line(text, line, recurse(axis + 1, offset + i * stride, next_indent, next_width),
                    element_width, indent);
        line += ' ';
      }
      if (summary) {
        extend_line(text, line, "...", element_width, indent);
        line += ' ';
      }
      for (std::int64_t i = trailing; i > 1; --i) {
        extend_line(text, line,
                    recurse(axis + 1, offset + (extent - i) * stride, next_indent, next_width),
                    element_width, indent);
        line += ' ';
      }
      extend_line(text, line,
                  recurse(axis + 1, offset + (extent - 1) * stride, next_indent, next_width),
                  element_width, indent);
      text += line;
    } else {
      const std::string separator(axes_left - 1, '\n');
      for (std::int64_t i = 0; i < leading; ++i)
        text +=
            indent + recurse(axis + 1, offset + i * stride, next_indent, next_width) + separator;
      if (summary)
        text += indent + "..." + separator;
      for (std::int64_t i = trailing; i > 1; --i)
        text += indent +
                recurse(axis + 1, offset + (extent - i) * stride, next_indent, next_width) +
                separator;
      text += indent + recurse(axis + 1, offset + (extent - 1) * stride, next_indent, next_width);
    }
    return "[" + text.substr(indent.size()) + "]";
  }

  shape_vector shape_;
  bool summarize_;
  std::function<std::string(std::int64_t)> element_;
  std::vector<std::int64_t> strides_;
};

template <class T>
std::string values_text(const T* data, const shape_vector& shape) {
  if (shape.empty())
    return scalar_text(data[0]);
  if (element_count(shape) == 0)
    return "[]";
  const bool summarize = element_count(shape) > print_threshold;
  if constexpr (is_float_like<T>) {
    array_printer probe{shape, summarize, {}};
    std::vector<T> shown;
    for (const auto index : probe.shown())
      shown.push_back(data[index]);
    const float_formatter<T> format{shown};
    array_printer printer{shape, summarize, [&](std::int64_t i) { return format(data[i]); }};
    return printer.print();
  } else {
    array_printer probe{shape, summarize, {}};
    std::size_t width = 0;
    for (const auto index : probe.shown())
      width = std::max(width, std::to_string(data[index]).size());
    array_printer printer{shape, summarize, [&](std::int64_t i) {
                            const auto text = std::to_string(data[i]);
                            return std::string(width - text.size(), ' ') + text;
                          }};
    return printer.print();
  }
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Shapes.

std::int64_t element_count(const shape_vector& shape) noexcept {
  // Unsigned, so that an absurd shape wraps instead of overflowing; constructors reject those.
  std::uint64_t count = 1;
  for (const auto extent : shape)
    count *= static_cast<std::uint64_t>(extent);
  return static_cast<std::int64_t>(count);
}

std::string shape_to_string(const shape_vector& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      text += ',';
    text += std::to_string(shape[i]);
  }
  if (shape.size() == 1)
    text += ',';
  text += ')';
  return text;
}

std::string shape_to_repr(const shape_vector& shape) {
  std::string text;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0)
      text += 'x';
    text += std::to_string(shape[i]);
  }
  return text;
}

std::string number_text(double value) {
  std::array<char, 64> buffer{};
  const auto result = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  return {buffer.data(), result.ptr};
}

shape_vector infer_reshape(const shape_vector& from, shape_vector to, std::string_view operation,
                           std::string_view input) {
  std::optional<std::size_t> inferred;
  std::int64_t known = 1;
  bool overflow = false;
  for (std::size_t i = 0; i < to.size(); ++i) {
    if (to[i] == -1) {
      if (inferred)
        fail(errc::invalid_argument, operation,
             "shape " + shape_to_string(to) + " has more than one -1");
      inferred = i;
    } else if (to[i] < 0) {
      fail(errc::invalid_argument, operation,
           "shape " + shape_to_string(to) + " has a negative extent");
    } else {
      overflow = overflow || __builtin_mul_overflow(known, to[i], &known);
    }
  }
  const std::int64_t count = element_count(from);
  if (inferred && !overflow && known != 0 && count % known == 0) {
    to[*inferred] = count / known;
    return to;
  }
  if (!inferred && !overflow && known == count)
    return to;
  const std::string elements = std::to_string(count) + " elements";
  if (input.empty()) {
    if (inferred)
      fail(errc::shape_mismatch, operation,
           "cannot infer the -1 of " + shape_to_string(to) + " from " + shape_to_string(from) +
               " of " + elements);
    fail(errc::shape_mismatch, operation,
         "cannot reshape " + shape_to_string(from) + " of " + elements + " into " +
             shape_to_string(to) + (overflow ? "" : " of " + std::to_string(known) + " elements"));
  }
  const std::string source =
      std::string{input} + " of shape " + shape_to_string(from) + " (" + elements + ")";
  if (inferred)
    fail(errc::shape_mismatch, operation,
         "cannot infer the -1 of shape " + shape_to_string(to) + " from " + source);
  fail(errc::shape_mismatch, operation,
       "cannot reshape " + source + " into " + shape_to_string(to));
}

// ---------------------------------------------------------------------------------------------
// Construction.

ndarray::ndarray(shape_vector shape, context ctx, troupe::dtype type)
    : shape_(std::move(shape)), dtype_(type), ctx_(ctx) {
  const std::size_t bytes = checked_nbytes(shape_, type, "ndarray");
  require_available(ctx, "ndarray");
  storage_ = storage_pool::shared().allocate(bytes, ctx);
}

ndarray ndarray::borrow(void* data, shape_vector shape, troupe::dtype type,
                        std::shared_ptr<const void> lender, context ctx) {
  const std::size_t bytes = checked_nbytes(shape, type, "borrow");
  if (!ctx.is_cpu())
    fail(errc::invalid_argument, "borrow",
         "only host memory can be borrowed (a cpu context), not " + ctx.to_string());
  if (bytes == 0 && data == nullptr)
    return ndarray(std::move(shape), ctx, type);
  if (data == nullptr)
    fail(errc::invalid_argument, "borrow",
         "the address of " + std::to_string(bytes) + " bytes is null");
  if (reinterpret_cast<std::uintptr_t>(data) % size_of(type) != 0)
    fail(errc::invalid_argument, "borrow",
         "the address is not aligned to the " + std::to_string(size_of(type)) + " bytes of a " +
             std::string{troupe::to_string(type)} + " element");
  if (lender == nullptr)
    fail(errc::invalid_argument, "borrow", "no keep-alive handle (lender) for the memory");
  ndarray out;
  out.shape_ = std::move(shape);
  out.dtype_ = type;
  out.ctx_ = ctx;
  out.storage_ = storage::borrow(data, bytes, ctx, std::move(lender));
  return out;
}

ndarray ndarray::empty(shape_vector shape, context ctx, troupe::dtype type) {
  return ndarray(std::move(shape), ctx, type);
}

ndarray ndarray::zeros(shape_vector shape, context ctx, troupe::dtype type) {
  return full(std::move(shape), 0.0, ctx, type);
}

ndarray ndarray::ones(shape_vector shape, context ctx, troupe::dtype type) {
  return full(std::move(shape), 1.0, ctx, type);
}

ndarray ndarray::full(shape_vector shape, double value, context ctx, troupe::dtype type) {
  ndarray out(std::move(shape), ctx, type);
  out.fill(value);
  return out;
}

ndarray ndarray::from_values(std::span<const float> values, shape_vector shape, context ctx,
                             troupe::dtype type) {
  checked_nbytes(shape, type, "from_values");
  if (static_cast<std::int64_t>(values.size()) != element_count(shape))
    fail(errc::shape_mismatch, "from_values",
         std::to_string(values.size()) + " values do not fill shape " + shape_to_string(shape) +
             " of " + std::to_string(element_count(shape)) + " elements");
  ndarray out(std::move(shape), ctx, type);
  if (ctx.is_cpu()) {
    host_convert(dtype::float32, values.data(), type, out.raw_data(), values.size());
  } else {
    ndarray host(out.shape(), context::cpu(), type);
    host_convert(dtype::float32, values.data(), type, host.raw_data(), values.size());
    host.copy_to(out);
  }
  return out;
}

ndarray ndarray::from_values(std::initializer_list<float> values, shape_vector shape, context ctx,
                             troupe::dtype type) {
  return from_values(std::span<const float>{values.begin(), values.size()}, std::move(shape), ctx,
                     type);
}

ndarray ndarray::random_uniform(double low, double high, shape_vector shape, std::uint64_t seed,
                                context ctx, troupe::dtype type) {
  if (!std::isfinite(low) || !std::isfinite(high) || !(low <= high) || !std::isfinite(high - low))
    fail(errc::invalid_argument, "random_uniform",
         "low " + number_text(low) + " and high " + number_text(high) +
             " do not make a finite range with low <= high");
  random_generator generator{seed};
  return sample(std::move(shape), ctx, type, "random_uniform", [&]<class T>() -> T {
    const double v = low + (high - low) * generator.uniform01();
    T result = convert_value<T>(v);
    // Rounding to a narrower type can reach `high`; the range stays half-open.
    if (low < high && to_double(result) >= high)
      result = next_below(result);
    return result;
  });
}

ndarray ndarray::random_normal(double mean, double stddev, shape_vector shape, std::uint64_t seed,
                               context ctx, troupe::dtype type) {
  if (!std::isfinite(mean) || !std::isfinite(stddev) || stddev < 0)
    fail(errc::invalid_argument, "random_normal",
         "mean " + number_text(mean) + " and standard deviation " + number_text(stddev) +
             " must be finite, the deviation >= 0");
  random_generator generator{seed};
  return sample(std::move(shape), ctx, type, "random_normal", [&]<class T>() -> T {
    return convert_value<T>(mean + stddev * generator.normal());
  });
}

// ---------------------------------------------------------------------------------------------
// Access.

std::size_t ndarray::nbytes() const noexcept {
  return is_none() ? 0 : static_cast<std::size_t>(size()) * size_of(dtype_);
}

void* ndarray::raw_data() {
  require_some("raw_data");
  engine::wait_for(storage_, engine::access_kind::write);
  return static_cast<unsigned char*>(storage_->data()) + byte_offset_;
}

const void* ndarray::raw_data() const {
  require_some("raw_data");
  engine::wait_for(storage_, engine::access_kind::read);
  return static_cast<const unsigned char*>(storage_->data()) + byte_offset_;
}

template <class T>
T* ndarray::data() {
  return const_cast<T*>(std::as_const(*this).data<T>());
}

template <class T>
const T* ndarray::data() const {
  require_some("data");
  if (dtype_of<T>() != dtype_)
    fail(errc::dtype_mismatch, "data",
         "requested element type " + std::string{troupe::to_string(dtype_of<T>())} +
             " does not match dtype " + std::string{troupe::to_string(dtype_)});
  if (!ctx_.is_cpu())
    fail(errc::context_mismatch, "data",
         "typed host access needs a cpu context, the array is on " + ctx_.to_string() +
             " (copy_to(context::cpu()) first)");
  return static_cast<const T*>(raw_data());
}

template float* ndarray::data<float>();
template double* ndarray::data<double>();
template std::int32_t* ndarray::data<std::int32_t>();
template std::int64_t* ndarray::data<std::int64_t>();
template std::uint16_t* ndarray::data<std::uint16_t>();
template const float* ndarray::data<float>() const;
template const double* ndarray::data<double>() const;
template const std::int32_t* ndarray::data<std::int32_t>() const;
template const std::int64_t* ndarray::data<std::int64_t>() const;
template const std::uint16_t* ndarray::data<std::uint16_t>() const;

bool ndarray::shares_storage_with(const ndarray& other) const noexcept {
  return storage_ != nullptr && storage_ == other.storage_;
}

void ndarray::require_some(const char* operation) const {
  require_handle(*this, operation);
}

void ndarray::wait_to_read() const {
  require_some("wait_to_read");
  engine::wait_for(storage_, engine::access_kind::read);
}

void ndarray::wait_to_write() const {
  require_some("wait_to_write");
  engine::wait_for(storage_, engine::access_kind::write);
}

// ---------------------------------------------------------------------------------------------
// Copies and views.

ndarray ndarray::copy_to(context target) const {
  require_some("copy_to");
  ndarray out(shape_, target, dtype_);
  copy_to(out);
  return out;
}

void ndarray::copy_to(ndarray& destination) const {
  require_some("copy_to");
  destination.require_some("copy_to");
  if (shape_ != destination.shape_)
    shape_mismatch("copy_to", shape_, destination.shape_);
  if (size() == 0)
    return;
  engine::push("copy_to", destination.ctx_, {.reads = {this}, .writes = {&destination}},
               [source = *this, destination]() mutable { source.copy_values_to(destination); });
}

void ndarray::copy_values_to(ndarray& destination) const {
  const auto n = static_cast<std::size_t>(size());
  // cudaMemcpy's areas may not overlap (memmove's may): a gpu view shifted against its destination
  // (a.slice(0, 3).copy_to(a.slice(1, 4))) is copied first, as apply_binary does.
  if (!ctx_.is_cpu() && overlaps(*this, destination)) {
    if (raw_data() == destination.raw_data() && dtype_ == destination.dtype_)
      return; // the same elements
    copy().copy_values_to(destination);
    return;
  }
  if (dtype_ == destination.dtype_) {
    copy_bytes(destination.raw_data(), destination.ctx_, raw_data(), ctx_, nbytes());
    return;
  }
  if (ctx_.is_cpu() && destination.ctx_.is_cpu()) {
    host_convert(dtype_, raw_data(), destination.dtype_, destination.raw_data(), n);
    return;
  }
  if (ctx_ == destination.ctx_ && dtype_ == dtype::float32 &&
      destination.dtype_ == dtype::float16) {
    kcuda::float_to_half(ctx_.id, static_cast<const float*>(raw_data()),
                         static_cast<std::uint16_t*>(destination.raw_data()), n);
    return;
  }
  if (ctx_ == destination.ctx_ && dtype_ == dtype::float16 &&
      destination.dtype_ == dtype::float32) {
    kcuda::half_to_float(ctx_.id, static_cast<const std::uint16_t*>(raw_data()),
                         static_cast<float*>(destination.raw_data()), n);
    return;
  }
  // Other conversions involving a gpu: convert on the host.
  const ndarray source = on_host(*this);
  if (destination.ctx_.is_cpu()) {
    host_convert(dtype_, source.raw_data(), destination.dtype_, destination.raw_data(), n);
    return;
  }
  ndarray converted(shape_, context::cpu(), destination.dtype_);
  host_convert(dtype_, source.raw_data(), destination.dtype_, converted.raw_data(), n);
  converted.copy_to(destination);
}

ndarray ndarray::as_type(troupe::dtype type) const {
  require_some("as_type");
  ndarray out(shape_, ctx_, type);
  copy_to(out);
  return out;
}

ndarray ndarray::reshape(shape_vector shape) const {
  require_some("reshape");
  shape = infer_reshape(shape_, std::move(shape), "reshape");
  ndarray view = *this;
  view.autograd_.reset();
  view.shape_ = std::move(shape);
  return view;
}

ndarray ndarray::slice(std::int64_t begin, std::int64_t end) const {
  require_some("slice");
  if (shape_.empty())
    fail(errc::invalid_argument, "slice", "a scalar array (shape ()) has no first axis");
  if (begin < 0 || end < begin || end > shape_[0])
    fail(errc::invalid_argument, "slice",
         "[" + std::to_string(begin) + ", " + std::to_string(end) +
             ") is out of range for the first axis of shape " + shape_to_string(shape_));
  const auto row_bytes =
      static_cast<std::size_t>(element_count(shape_vector(shape_.begin() + 1, shape_.end()))) *
      size_of(dtype_);
  ndarray view = *this;
  view.autograd_.reset();
  view.shape_[0] = end - begin;
  view.byte_offset_ += static_cast<std::size_t>(begin) * row_bytes;
  return view;
}

ndarray ndarray::at(std::int64_t index) const {
  require_some("at");
  if (shape_.empty())
    fail(errc::invalid_argument, "at", "a scalar array (shape ()) has no first axis");
  if (index < 0 || index >= shape_[0])
    fail(errc::invalid_argument, "at",
         "index " + std::to_string(index) + " is out of range for the first axis of shape " +
             shape_to_string(shape_));
  ndarray view = slice(index, index + 1);
  view.shape_.erase(view.shape_.begin());
  return view;
}

ndarray& ndarray::fill(double value) {
  require_some("fill");
  if (size() == 0)
    return *this;
  engine::push("fill", ctx_, {.writes = {this}},
               [target = *this, value]() mutable { target.fill_values(value); });
  return *this;
}

void ndarray::fill_values(double value) {
  const auto n = static_cast<std::size_t>(size());
  if (ctx_.is_cpu()) {
    host_fill(dtype_, raw_data(), value, n);
  } else if (value == 0.0 && !std::signbit(value)) {
    kcuda::zero(ctx_.id, raw_data(), nbytes()); // all-zero bits are 0 in every dtype
  } else if (dtype_ == dtype::float32) {
    kcuda::fill(ctx_.id, static_cast<float*>(raw_data()), static_cast<float>(value), n);
  } else {
    ndarray host(shape_, context::cpu(), dtype_);
    host_fill(dtype_, host.raw_data(), value, n);
    host.copy_to(*this);
  }
}

template <class T>
std::vector<T> ndarray::to_vector() const {
  require_some("to_vector");
  const ndarray host = on_host(*this);
  std::vector<T> out(static_cast<std::size_t>(size()));
  visit_dtype(dtype_, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const auto* src = static_cast<const S*>(host.raw_data());
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = convert_value<T>(src[i]);
  });
  return out;
}

template std::vector<float> ndarray::to_vector<float>() const;
template std::vector<double> ndarray::to_vector<double>() const;
template std::vector<std::int32_t> ndarray::to_vector<std::int32_t>() const;
template std::vector<std::int64_t> ndarray::to_vector<std::int64_t>() const;

double ndarray::as_scalar() const {
  require_some("as_scalar");
  if (size() != 1)
    fail(errc::invalid_argument, "as_scalar",
         "the array has " + std::to_string(size()) + " elements (shape " + shape_to_string(shape_) +
             "), not 1");
  return to_vector<double>().front();
}

// ---------------------------------------------------------------------------------------------
// Arithmetic.

ndarray& ndarray::operator+=(const ndarray& rhs) {
  binary_in_place(binary_op::add, *this, rhs);
  return *this;
}
ndarray& ndarray::operator-=(const ndarray& rhs) {
  binary_in_place(binary_op::sub, *this, rhs);
  return *this;
}
ndarray& ndarray::operator*=(const ndarray& rhs) {
  binary_in_place(binary_op::mul, *this, rhs);
  return *this;
}
ndarray& ndarray::operator/=(const ndarray& rhs) {
  binary_in_place(binary_op::div, *this, rhs);
  return *this;
}
ndarray& ndarray::operator+=(double rhs) {
  scalar_in_place(scalar_op::add, "add", *this, rhs);
  return *this;
}
ndarray& ndarray::operator-=(double rhs) {
  scalar_in_place(scalar_op::add, "sub", *this, -rhs);
  return *this;
}
ndarray& ndarray::operator*=(double rhs) {
  scalar_in_place(scalar_op::mul, "mul", *this, rhs);
  return *this;
}
ndarray& ndarray::operator/=(double rhs) {
  scalar_in_place(scalar_op::div, "div", *this, rhs);
  return *this;
}

namespace {

/// Inside a record or trace scope, arithmetic on arrays that take part goes through the
/// operators of engine/nd.hpp, which autograd and tracing see.
bool observed(const ndarray& a) {
  return detail::operators_observed() && a.autograd_state() != nullptr;
}
bool observed(const ndarray& a, const ndarray& b) {
  return detail::operators_observed() &&
         (a.autograd_state() != nullptr || b.autograd_state() != nullptr);
}

} // namespace

ndarray ndarray::operator-() const {
  if (observed(*this))
    return nd::negative(*this);
  return scalar_result(scalar_op::mul, "negate", *this, -1.0);
}

ndarray operator+(const ndarray& lhs, const ndarray& rhs) {
  if (observed(lhs, rhs))
    return nd::add(lhs, rhs);
  return binary_result(binary_op::add, lhs, rhs);
}
ndarray operator-(const ndarray& lhs, const ndarray& rhs) {
  if (observed(lhs, rhs))
    return nd::subtract(lhs, rhs);
  return binary_result(binary_op::sub, lhs, rhs);
}
ndarray operator*(const ndarray& lhs, const ndarray& rhs) {
  if (observed(lhs, rhs))
    return nd::multiply(lhs, rhs);
  return binary_result(binary_op::mul, lhs, rhs);
}
ndarray operator/(const ndarray& lhs, const ndarray& rhs) {
  if (observed(lhs, rhs))
    return nd::divide(lhs, rhs);
  return binary_result(binary_op::div, lhs, rhs);
}
ndarray operator+(const ndarray& lhs, double rhs) {
  if (observed(lhs))
    return nd::add_scalar(lhs, rhs);
  return scalar_result(scalar_op::add, "add", lhs, rhs);
}
ndarray operator-(const ndarray& lhs, double rhs) {
  if (observed(lhs))
    return nd::add_scalar(lhs, -rhs);
  return scalar_result(scalar_op::add, "sub", lhs, -rhs);
}
ndarray operator*(const ndarray& lhs, double rhs) {
  if (observed(lhs))
    return nd::multiply_scalar(lhs, rhs);
  return scalar_result(scalar_op::mul, "mul", lhs, rhs);
}
ndarray operator/(const ndarray& lhs, double rhs) {
  // Recorded as a multiplication by 1/rhs, which may differ from the division in the last bit.
  if (observed(lhs))
    return nd::multiply_scalar(lhs, 1.0 / rhs);
  return scalar_result(scalar_op::div, "div", lhs, rhs);
}
ndarray operator+(double lhs, const ndarray& rhs) {
  return rhs + lhs;
}
ndarray operator*(double lhs, const ndarray& rhs) {
  return rhs * lhs;
}

// ---------------------------------------------------------------------------------------------
// Autograd.

void ndarray::attach_grad(troupe::grad_req req) {
  require_some("attach_grad");
  auto state = std::make_shared<autograd_entry>();
  state->req = req;
  if (req != troupe::grad_req::null)
    state->grad = zeros(shape_, ctx_, dtype_);
  autograd_ = std::move(state);
}

ndarray ndarray::grad() const {
  return autograd_ ? autograd_->grad : ndarray{};
}

troupe::grad_req ndarray::gradient_request() const noexcept {
  return autograd_ ? autograd_->req : troupe::grad_req::null;
}

ndarray ndarray::detach() const {
  ndarray plain = *this;
  plain.autograd_.reset();
  return plain;
}

void ndarray::backward() const {
  autograd::backward(*this, ndarray{}, false);
}

void ndarray::backward(const ndarray& head_grad, bool retain_graph) const {
  autograd::backward(*this, head_grad, retain_graph);
}

double ndarray::sum() const {
  require_some("sum");
  const ndarray host = on_host(*this);
  return host_sum(dtype_, host.raw_data(), static_cast<std::size_t>(size()));
}

double ndarray::l2_norm() const {
  require_some("l2_norm");
  const ndarray host = on_host(*this);
  return host_l2_norm(dtype_, host.raw_data(), static_cast<std::size_t>(size()));
}

// ---------------------------------------------------------------------------------------------
// Printing.

std::string ndarray::to_string() const {
  if (is_none())
    return "<NDArray none>";
  const ndarray host = on_host(*this);
  std::string text = visit_dtype(dtype_, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return values_text(static_cast<const T*>(host.raw_data()), shape_);
  });
  text += "\n<NDArray ";
  text += shape_to_repr(shape_);
  text += " @";
  text += ctx_.to_string();
  text += '>';
  return text;
}

std::ostream& operator<<(std::ostream& out, const ndarray& array) {
  return out << array.to_string();
}

// ---------------------------------------------------------------------------------------------
// Reductions of the KVStore.

namespace {

// What sum_into and axpy queue, run on the output's lane.
void sum_values_into(std::span<const ndarray> inputs, ndarray& out);
void axpy_values(double alpha, const ndarray& x, ndarray& y);

} // namespace

void sum_into(std::span<const ndarray> inputs, ndarray& out) {
  require_handle(out, "sum_into");
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const std::string what = "input " + std::to_string(k) + " ";
    require_handle(inputs[k], "sum_into");
    // A host sum reads any cpu(i) where it is: they are all host memory.
    const bool on_host = inputs[k].ctx().is_cpu() && out.ctx().is_cpu();
    if (!on_host || inputs[k].dtype() != out.dtype())
      require_same_kind("sum_into", inputs[k], out, what);
    if (inputs[k].shape() != out.shape())
      shape_mismatch("sum_into", inputs[k].shape(), out.shape(), what);
  }
  if (out.size() == 0)
    return;
  if (inputs.empty()) {
    out.fill(0.0);
    return;
  }
  std::vector<const ndarray*> reads;
  engine::add_addresses(reads, inputs);
  const ndarray* writes[] = {&out};
  engine::push("sum_into", out.ctx(), reads, writes,
               [inputs = std::vector<ndarray>(inputs.begin(), inputs.end()), out]() mutable {
                 sum_values_into(inputs, out);
               });
}

namespace {

void sum_values_into(std::span<const ndarray> inputs, ndarray& out) {
  const auto n = static_cast<std::size_t>(out.size());
  // The kernels let `out` be inputs[0] itself but overlap nothing else.
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (overlaps(inputs[k], out) && (k > 0 || inputs[k].raw_data() != out.raw_data())) {
      ndarray result(out.shape(), out.ctx(), out.dtype());
      sum_values_into(inputs, result);
      result.copy_to(out);
      return;
    }
  }
  const context ctx = out.ctx();
  if (ctx.is_cpu()) {
    host_sum_n(out.dtype(), inputs, out.raw_data(), n);
    return;
  }
  if (out.dtype() == dtype::float32) {
    std::vector<const float*> pointers;
    pointers.reserve(inputs.size());
    for (const auto& input : inputs)
      pointers.push_back(static_cast<const float*>(input.raw_data()));
    kcuda::sum_n(ctx.id, pointers.data(), pointers.size(), static_cast<float*>(out.raw_data()), n);
    return;
  }
  if (out.dtype() == dtype::float16) {
    // Accumulated in float32 and rounded once, bit for bit what the host sum gives.
    std::vector<const std::uint16_t*> pointers;
    pointers.reserve(inputs.size());
    for (const auto& input : inputs)
      pointers.push_back(static_cast<const std::uint16_t*>(input.raw_data()));
    kcuda::sum_n_half(ctx.id, pointers.data(), pointers.size(),
                      static_cast<std::uint16_t*>(out.raw_data()), n);
    return;
  }
  std::vector<ndarray> host_inputs;
  host_inputs.reserve(inputs.size());
  for (const auto& input : inputs)
    host_inputs.push_back(input.copy_to(context::cpu()));
  ndarray result(out.shape(), context::cpu(), out.dtype());
  host_sum_n(out.dtype(), host_inputs, result.raw_data(), n);
  result.copy_to(out);
}

} // namespace

void axpy(double alpha, const ndarray& x, ndarray& y) {
  require_handle(x, "axpy");
  require_handle(y, "axpy");
  require_same_kind("axpy", x, y);
  if (x.shape() != y.shape())
    shape_mismatch("axpy", x.shape(), y.shape());
  const auto n = static_cast<std::size_t>(y.size());
  if (n == 0)
    return;
  engine::push("axpy", y.ctx(), {.reads = {&x}, .writes = {&y}},
               [alpha, x, y]() mutable { axpy_values(alpha, x, y); });
}

namespace {

void axpy_values(double alpha, const ndarray& x, ndarray& y) {
  const auto n = static_cast<std::size_t>(y.size());
  if (overlaps(x, y) && x.raw_data() != y.raw_data()) {
    axpy_values(alpha, x.copy(), y);
    return;
  }
  const context ctx = y.ctx();
  if (ctx.is_cpu()) {
    host_axpy(y.dtype(), alpha, x.raw_data(), y.raw_data(), n);
    return;
  }
  if (y.dtype() == dtype::float32) {
    kcuda::axpy(ctx.id, static_cast<float>(alpha), static_cast<const float*>(x.raw_data()),
                static_cast<float*>(y.raw_data()), n);
    return;
  }
  ndarray hy = y.copy_to(context::cpu());
  const ndarray hx = x.copy_to(context::cpu());
  host_axpy(y.dtype(), alpha, hx.raw_data(), hy.raw_data(), n);
  hy.copy_to(y);
}

} // namespace

} // namespace troupe
