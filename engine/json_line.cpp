#include "engine/json_line.hpp"

#include <cmath>
#include <cstdlib>
#include <string>

namespace troupe::json_line {
namespace {

/// `value` through printf's `format` and back: the double nearest to the digits printed. strtod
/// reads the decimal point of the same locale snprintf wrote it in.
double through_text(const char* format, int precision, double value) {
  if (!std::isfinite(value))
    return value;
  char text[512];
  std::snprintf(text, sizeof text, format, precision, value);
  return std::strtod(text, nullptr);
}

} // namespace

double fixed(double value, int decimals) {
  return through_text("%.*f", decimals, value);
}

double significant(double value, int digits) {
  return through_text("%.*g", digits, value);
}

void print(const object& line, std::FILE* out) {
  const std::string text = line.dump() + "\n";
  std::fwrite(text.data(), 1, text.size(), out);
  std::fflush(out);
}

} // namespace troupe::json_line
