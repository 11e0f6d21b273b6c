#include "apps/training_report.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <sys/ioctl.h>
#include <unistd.h>

#include <fmt/core.h>

#include "engine/json_line.hpp"

namespace troupe::report {

std::string epoch_line(const epoch_metrics& m) {
  std::string line = fmt::format("epoch {} train_loss {:.4f} train_acc {:.2f}", m.epoch,
                                 m.train_loss, m.train_acc);
  if (m.test_acc)
    line += fmt::format(" test_acc {:.2f}", *m.test_acc);
  line += fmt::format(" samples_per_s {:.0f} time_s {:.2f}", m.samples_per_s, m.time_s);
  return line;
}

std::string final_line(std::span<const epoch_metrics> epochs, const run_summary& run) {
  double time_s = 0;
  std::int64_t samples = 0;
  for (const auto& m : epochs) {
    time_s += m.time_s;
    samples += m.samples;
  }
  const epoch_metrics& last = epochs.back();
  json_line::object line;
  line["final_test_acc"] = json_line::significant(last.test_acc.value_or(NAN), 6);
  line["final_train_loss"] = json_line::significant(last.train_loss, 6);
  line["samples_per_s"] = json_line::significant(time_s > 0 ? samples / time_s : 0, 6);
  line["time_s"] = json_line::significant(time_s, 6);
  line["epochs"] = run.epochs;
  line["model"] = run.model;
  line["kvstore"] = run.kvstore;
  line["gradient_compression"] = run.gradient_compression;
  line["workers"] = run.workers;
  line["batch_size"] = run.batch_size;
  line["step_batch"] = run.step_batch;
  line["contexts"] = run.contexts;
  line["stages"] = run.stages;
  line["micro_batches"] = run.micro_batches;
  line["threads"] = run.threads;
  line["hybridize"] = run.hybridize;
  line["job_time_s"] = json_line::significant(run.job_time_s, 6);
  line["job_samples_per_s"] =
      json_line::significant(run.job_time_s > 0 ? samples / run.job_time_s : 0, 6);
  line["parameters"] = run.parameters;
  if (!last.worker_samples_per_s.empty()) {
    auto rates = json_line::object::array();
    for (double rate : last.worker_samples_per_s)
      rates.push_back(json_line::significant(rate, 6));
    line["worker_samples_per_s"] = rates;
  }
  return line.dump();
}

std::string csv_text(std::span<const epoch_metrics> epochs) {
  std::size_t workers = 0;
  for (const auto& m : epochs)
    workers = std::max(workers, m.worker_samples_per_s.size());
  std::string text =
      "epoch,train_loss,train_acc,test_acc,samples_per_s,time_s,learning_rate,samples";
  for (std::size_t w = 0; w < workers; ++w)
    text += fmt::format(",worker{}_samples_per_s", w);
  text += "\n";
  for (const auto& m : epochs) {
    text += fmt::format("{},{:.6f},{:.4f},{},{:.1f},{:.4f},{:.8g},{}", m.epoch, m.train_loss,
                        m.train_acc, m.test_acc ? fmt::format("{:.4f}", *m.test_acc) : "",
                        m.samples_per_s, m.time_s, m.learning_rate, m.samples);
    for (std::size_t w = 0; w < workers; ++w)
      text += w < m.worker_samples_per_s.size() ? fmt::format(",{:.1f}", m.worker_samples_per_s[w])
                                                : std::string{","};
    text += "\n";
  }
  return text;
}

namespace {

status write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out)
    return error{errc::io_error, "cannot open " + path.string() + " for writing"};
  out << text;
  out.flush();
  if (!out)
    return error{errc::io_error, "cannot write " + path.string()};
  return {};
}

std::string xml_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '&':
      out += "&amp;";
      break;
    case '"':
      out += "&quot;";
      break;
    default:
      out += c;
    }
  }
  return out;
}

/// A number as a tick label: no trailing zeros, no exponent for the ranges plotted here.
std::string tick_label(double value) {
  if (std::abs(value) < 1e-12)
    return "0";
  return fmt::format("{:g}", value);
}

struct series {
  std::string name;
  std::string color;
  bool dashed = false;
  std::vector<std::pair<double, double>> points; ///< (epoch, value)
};

/// Where a panel's plot area sits and how epochs and values map into it.
struct panel_frame {
  double px, py, pw, ph; ///< the plot area: left, top, width, height
  double x_low, x_high;  ///< epochs at the left and right edges
  double y_min = 0;      ///< the value at the bottom edge
  double y_max = 0;      ///< the value at the top edge
  std::vector<double> x_ticks = {};
  std::vector<double> y_ticks = {};

  double sx(double epoch) const { return px + (epoch - x_low) / (x_high - x_low) * pw; }
  double sy(double value) const {
    return y_max == y_min ? py + ph / 2 : py + ph - (value - y_min) / (y_max - y_min) * ph;
  }
};

/// The plot area inside a frame at (x0, y0) of size w × h, with epochs 1..x_max on x (integer
/// ticks; a single epoch sits in the middle) and y covering every point of `lines`. `y_clamp`
/// bounds the ticks (accuracy: 0..100).
panel_frame frame_panel(double x0, double y0, double w, double h, std::span<const series> lines,
                        double x_max, std::optional<std::pair<double, double>> y_clamp) {
  constexpr double left = 64, right = 16, top = 34, bottom = 46;
  panel_frame f{.px = x0 + left,
                .py = y0 + top,
                .pw = w - left - right,
                .ph = h - top - bottom,
                .x_low = 1,
                .x_high = std::max(x_max, 1.0)};
  if (f.x_high == f.x_low) {
    f.x_low = 0;
    f.x_high = 2;
  }
  for (double t : nice_ticks(f.x_low, f.x_high, 8))
    if (t >= 1 && t <= std::max(x_max, 1.0) && t == std::floor(t))
      f.x_ticks.push_back(t);

  double y_low = INFINITY, y_high = -INFINITY;
  for (const auto& s : lines)
    for (auto [e, v] : s.points) {
      y_low = std::min(y_low, v);
      y_high = std::max(y_high, v);
    }
  if (!std::isfinite(y_low)) {
    y_low = y_clamp ? y_clamp->first : 0;
    y_high = y_clamp ? y_clamp->second : 1;
  }
  f.y_ticks = nice_ticks(y_low, y_high, 6);
  if (y_clamp) {
    // Accuracy never goes outside [0, 100]: no tick there either.
    std::erase_if(f.y_ticks, [&](double t) { return t < y_clamp->first || t > y_clamp->second; });
    if (f.y_ticks.size() < 2)
      f.y_ticks =
          nice_ticks(std::max(y_low - 1, y_clamp->first), std::min(y_high + 1, y_clamp->second), 6);
  }
  f.y_min = std::min(f.y_ticks.front(), y_low);
  f.y_max = std::max(f.y_ticks.back(), y_high);
  return f;
}

/// The panel's title, grid lines, ticks, axes and axis labels.
void draw_axes(std::string& svg, const panel_frame& f, double x0, double y0, std::string_view title,
               std::string_view y_name) {
  const double px = f.px, py = f.py, pw = f.pw, ph = f.ph;
  svg += fmt::format(R"(<g class="panel"><text x="{:.1f}" y="{:.1f}" class="ptitle">{}</text>)"
                     "\n",
                     px + pw / 2, y0 + 20, xml_escape(title));
  for (double t : f.y_ticks) {
    svg += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" class="grid"/>)"
                       R"(<text x="{:.1f}" y="{:.1f}" class="ytick">{}</text>)"
                       "\n",
                       px, f.sy(t), px + pw, f.sy(t), px - 6, f.sy(t) + 4, tick_label(t));
  }
  for (double t : f.x_ticks) {
    svg +=
        fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" class="tick"/>)"
                    R"(<text x="{:.1f}" y="{:.1f}" class="xtick">{}</text>)"
                    "\n",
                    f.sx(t), py + ph, f.sx(t), py + ph + 5, f.sx(t), py + ph + 18, tick_label(t));
  }
  svg += fmt::format(R"(<path d="M{:.1f},{:.1f} V{:.1f} H{:.1f}" class="axis"/>)"
                     "\n",
                     px, py, py + ph, px + pw);
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="xlabel">epoch</text>)"
                     "\n",
                     px + pw / 2, py + ph + 38);
  svg += fmt::format(
      R"svg(<text transform="translate({:.1f},{:.1f}) rotate(-90)" class="ylabel">{}</text>)svg"
      "\n",
      x0 + 16, py + ph / 2, xml_escape(y_name));
}

/// Each series: a line through its points and a marker with a tooltip at each.
void draw_series(std::string& svg, const panel_frame& f, std::span<const series> lines) {
  for (const auto& s : lines) {
    if (s.points.empty())
      continue;
    std::string path;
    for (auto [e, v] : s.points)
      path += fmt::format("{}{:.1f},{:.1f} ", path.empty() ? "M" : "L", f.sx(e), f.sy(v));
    svg += fmt::format(R"(<path d="{}" fill="none" stroke="{}" stroke-width="2"{}/>)"
                       "\n",
                       path, s.color, s.dashed ? R"( stroke-dasharray="6,4")" : "");
    for (auto [e, v] : s.points)
      svg += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3.5" fill="{}">)"
                         R"(<title>{} epoch {}: {:.4g}</title></circle>)"
                         "\n",
                         f.sx(e), f.sy(v), s.color, xml_escape(s.name), e, v);
  }
}

/// The legend inside the plot area, in the corner the curves leave free: top right for a loss
/// (it falls), bottom right for an accuracy (it rises).
void draw_legend(std::string& svg, const panel_frame& f, std::span<const series> lines,
                 bool at_bottom) {
  double ly = at_bottom ? f.py + f.ph - 8 - 18.0 * static_cast<double>(lines.size()) : f.py + 8;
  for (const auto& s : lines) {
    double lx = f.px + f.pw - 120;
    svg += fmt::format(
        R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="2"{}/>)"
        R"(<text x="{:.1f}" y="{:.1f}" class="legend">{}</text>)"
        "\n",
        lx, ly + 6, lx + 24, ly + 6, s.color, s.dashed ? R"( stroke-dasharray="6,4")" : "", lx + 30,
        ly + 10, xml_escape(s.name));
    ly += 18;
  }
}

/// One panel: a frame at (x0, y0) of size w × h inside which the plot area sits, its axes,
/// ticks, grid lines, the series and a legend. `y_clamp` bounds the ticks (accuracy: 0..100).
void draw_panel(std::string& svg, double x0, double y0, double w, double h, std::string_view title,
                std::string_view y_name, std::span<const series> lines, double x_max,
                std::optional<std::pair<double, double>> y_clamp, bool legend_at_bottom) {
  const panel_frame f = frame_panel(x0, y0, w, h, lines, x_max, y_clamp);
  draw_axes(svg, f, x0, y0, title, y_name);
  draw_series(svg, f, lines);
  draw_legend(svg, f, lines, legend_at_bottom);
  svg += "</g>\n";
}

} // namespace

std::vector<double> nice_ticks(double low, double high, int max_ticks) {
  if (!std::isfinite(low) || !std::isfinite(high))
    return {0, 1};
  if (low > high)
    std::swap(low, high);
  if (high - low < 1e-12) {
    double pad = std::abs(low) > 1e-12 ? std::abs(low) * 0.05 : 1;
    low -= pad;
    high += pad;
  }
  max_ticks = std::max(max_ticks, 2);
  double raw = (high - low) / (max_ticks - 1);
  double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * magnitude >= raw) {
      step = m * magnitude;
      break;
    }
  std::vector<double> ticks;
  double first = std::floor(low / step) * step;
  for (double t = first; t < high + step * 0.999; t += step)
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return ticks;
}

std::string svg_plot(std::span<const epoch_metrics> epochs, std::string_view title) {
  // A distributed job's third panel: each worker's throughput, so that a straggler shows.
  std::size_t workers = 0;
  for (const auto& m : epochs)
    workers = std::max(workers, m.worker_samples_per_s.size());
  constexpr double panel_width = 480, height = 400, head = 36;
  const double width = panel_width * (workers > 0 ? 3 : 2);
  std::string svg = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}">)"
      "\n",
      width, height);
  svg += R"(<style>
text { font-family: sans-serif; font-size: 12px; fill: #222; }
.title { font-size: 16px; text-anchor: middle; font-weight: bold; }
.ptitle { font-size: 14px; text-anchor: middle; }
.ytick { text-anchor: end; }
.xtick, .xlabel, .ylabel { text-anchor: middle; }
.grid { stroke: #ddd; stroke-width: 1; }
.tick, .axis { stroke: #444; stroke-width: 1; fill: none; }
</style>
)";
  svg += fmt::format(R"(<rect width="{}" height="{}" fill="white"/>)"
                     "\n",
                     width, height);
  svg += fmt::format(R"(<text x="{:.1f}" y="24" class="title">{}</text>)"
                     "\n",
                     width / 2, xml_escape(title));

  series loss{"train loss", "#1f77b4", false, {}};
  series train_acc{"train accuracy", "#1f77b4", true, {}};
  series test_acc{"test accuracy", "#d62728", false, {}};
  double x_max = 1;
  for (const auto& m : epochs) {
    loss.points.emplace_back(m.epoch, m.train_loss);
    train_acc.points.emplace_back(m.epoch, m.train_acc);
    if (m.test_acc)
      test_acc.points.emplace_back(m.epoch, *m.test_acc);
    x_max = std::max(x_max, static_cast<double>(m.epoch));
  }
  std::vector<series> left{loss};
  std::vector<series> right{train_acc};
  if (!test_acc.points.empty())
    right.push_back(test_acc);
  draw_panel(svg, 0, head, panel_width, height - head, "loss", "mean cross-entropy", left, x_max,
             std::nullopt, false);
  draw_panel(svg, panel_width, head, panel_width, height - head, "accuracy", "accuracy (%)", right,
             x_max, std::pair{0.0, 100.0}, true);
  if (workers > 0) {
    static constexpr std::array<const char*, 8> colors{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                       "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
    std::vector<series> rates;
    for (std::size_t w = 0; w < workers; ++w) {
      series rate{fmt::format("worker {}", w), colors[w % colors.size()], w >= colors.size(), {}};
      for (const auto& m : epochs)
        if (w < m.worker_samples_per_s.size() && m.worker_samples_per_s[w] > 0)
          rate.points.emplace_back(m.epoch, m.worker_samples_per_s[w]);
      rates.push_back(std::move(rate));
    }
    draw_panel(svg, 2 * panel_width, head, panel_width, height - head, "throughput per worker",
               "samples/s", rates, x_max, std::pair{0.0, std::numeric_limits<double>::max()}, true);
  }
  svg += "</svg>\n";
  return svg;
}

status write_csv(const std::filesystem::path& path, std::span<const epoch_metrics> epochs) {
  return write_text(path, csv_text(epochs));
}

status write_svg(const std::filesystem::path& path, std::span<const epoch_metrics> epochs,
                 std::string_view title) {
  return write_text(path, svg_plot(epochs, title));
}

progress::progress(std::optional<mode> how, std::FILE* stream,
                   std::chrono::milliseconds line_interval)
    : mode_(how.value_or(::isatty(::fileno(stream)) ? mode::bar : mode::lines)), stream_(stream),
      line_interval_(line_interval) {}

void progress::start(std::string label, std::int64_t total_batches) {
  label_ = std::move(label);
  total_ = total_batches;
  batches_ = samples_ = 0;
  loss_ = accuracy_ = 0;
  start_ = last_draw_ = std::chrono::steady_clock::now();
  drawn_ = false;
}

void progress::update(std::int64_t batches, std::int64_t samples, double mean_loss,
                      double accuracy) {
  batches_ = batches;
  samples_ = samples;
  loss_ = mean_loss;
  accuracy_ = accuracy;
  if (mode_ == mode::off)
    return;
  auto now = std::chrono::steady_clock::now();
  auto interval = mode_ == mode::bar ? std::chrono::milliseconds(100) : line_interval_;
  if (now - last_draw_ >= interval || (mode_ == mode::bar && batches == total_)) {
    last_draw_ = now;
    draw();
  }
}

void progress::draw() {
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = seconds > 0 ? samples_ / seconds : 0;
  std::string stats = fmt::format("{}/{} batches  {:.0f} samples/s  loss {:.4f}  acc {:.2f}%",
                                  batches_, total_, rate, loss_, accuracy_);
  if (mode_ == mode::bar) {
    // A line longer than the terminal wraps, and \r then redraws only its last part: the bar
    // shrinks to fit, and the text is cut as a last resort.
    int columns = 80;
    winsize size{};
    if (::ioctl(::fileno(stream_), TIOCGWINSZ, &size) == 0 && size.ws_col > 0)
      columns = size.ws_col;
    const int room = columns - 1 - static_cast<int>(label_.size() + stats.size()) - 4;
    const int width = std::clamp(room, 0, 30);
    std::string line = label_;
    if (width >= 5) {
      int filled = total_ > 0 ? static_cast<int>(width * batches_ / total_) : width;
      std::string bar(static_cast<std::size_t>(filled), '=');
      if (filled < width)
        bar += '>' + std::string(static_cast<std::size_t>(width - filled - 1), ' ');
      line += " [" + bar + "]";
    }
    line += " " + stats;
    if (static_cast<int>(line.size()) > columns - 1)
      line.resize(static_cast<std::size_t>(std::max(columns - 1, 0)));
    // \r and erase-to-end-of-line: the line is redrawn in place.
    std::fprintf(stream_, "\r%s\x1b[K", line.c_str());
  } else {
    std::fprintf(stream_, "%s %s\n", label_.c_str(), stats.c_str());
  }
  std::fflush(stream_);
  drawn_ = true;
}

void progress::finish() {
  if (mode_ == mode::bar && drawn_) {
    std::fprintf(stream_, "\r\x1b[K");
    std::fflush(stream_);
  }
  drawn_ = false;
}

} // namespace troupe::report
