#pragma once
// Machine-readable output: one JSON object per line, built with nlohmann-json. train_mnist and
// the benchmarks print such lines on stdout for scripts (bench/run_*.sh read them with awk, sed
// and python) and tests. Keys keep the order they were added in (ordered_json) and the line is
// the compact dump, `"key":value` with no spaces:
//
//   {"bench":"kvbench","type":"dist_sync","op":"push","bytes":4096,...,"median_us":160.2}
//
// Numbers: dump() writes a double in the shortest form that reads back to the same double, so a
// measured value is first rounded to the precision the line promises (fixed() for a number of
// decimals, significant() for significant digits): 2.16, not 2.1604328765. A NaN or an infinity
// prints as null.

#include <cstdio>
#include <nlohmann/json.hpp>

namespace troupe::json_line {

/// A line's object: keys in insertion order.
using object = nlohmann::ordered_json;

/// The double nearest to `value` printed with `decimals` digits after the point (printf's
/// "%.*f": 2.1604 with 3 decimals is 2.16, which dump() prints as 2.16). NaN and infinities stay.
double fixed(double value, int decimals);

/// The double nearest to `value` printed with `digits` significant digits (printf's "%.*g":
/// 41234.567 with 6 digits is 41234.6). NaN and infinities stay.
double significant(double value, int digits);

/// Writes `line` compact and a newline to `out`, then flushes, so that a reader of a pipe gets
/// each line whole as soon as it is made.
void print(const object& line, std::FILE* out = stdout);

} // namespace troupe::json_line
