#pragma once
// What a training job shows and writes about its progress: a per-epoch progress display on
// stderr, one summary line per epoch, a CSV of the per-epoch metrics, an SVG plot of loss and
// accuracy that a person can open in a browser, and the final JSON line that scripts read (built
// with nlohmann-json, engine/json_line.hpp). Used by apps/train_mnist; nothing here knows about
// models or stores.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/error.hpp"

namespace troupe::report {

/// The metrics of one finished epoch. Accuracies are percentages.
struct epoch_metrics {
  int epoch = 0;                  ///< 1-based
  double train_loss = 0;          ///< mean per-sample loss over the epoch's batches
  double train_acc = 0;           ///< running accuracy over the epoch's training samples
  std::optional<double> test_acc; ///< absent where this process did not evaluate
  double samples_per_s = 0;       ///< training samples of the whole job per second of the loop
  double time_s = 0;              ///< seconds of the training loop (evaluation not included)
  double learning_rate = 0;       ///< the rate at the epoch's end
  std::int64_t samples = 0;       ///< training samples of the whole job in the epoch
  /// A distributed job: each worker's own samples over its own loop time, by rank (gathered at
  /// the epoch's barrier); 0 for a worker lost within the quorum. Empty in one process.
  std::vector<double> worker_samples_per_s;
};

/// `epoch 3 train_loss 0.4100 train_acc 85.20 test_acc 84.90 samples_per_s 41000 time_s 1.60`
/// (test_acc is left out when absent).
std::string epoch_line(const epoch_metrics& m);

/// What the final JSON line says of the run besides its epochs' metrics.
struct run_summary {
  int epochs = 0;
  std::string model;
  std::string kvstore;
  /// --gradient-compression as gradient_compression::describe() says it ("none" when off).
  std::string gradient_compression = "none";
  int workers = 1;
  std::int64_t batch_size = 0; ///< per worker
  std::int64_t step_batch = 0; ///< what trainer.step() was given
  std::size_t contexts = 1;
  std::size_t stages = 1;         ///< model-parallel stages (1: none)
  std::int64_t micro_batches = 1; ///< parts of a batch pipelined through the stages
  int threads = 1;
  bool hybridize = false;
  /// Wall time from the first step to the end of the last epoch's barrier: in a dist job every
  /// epoch ends when the slowest worker's does, so this is the job's time, stragglers included
  /// (and the evaluations rank 0 makes between epochs).
  double job_time_s = 0;
  std::int64_t parameters = 0; ///< elements of every parameter of the network
};

/// The final JSON line that scripts read (no newline), compact, keys in this order:
/// {"final_test_acc":..,"final_train_loss":..,"samples_per_s":..,"time_s":..,"epochs":..,
/// "model":"..","kvstore":"..","gradient_compression":"..","workers":..,"batch_size":..,
/// "step_batch":..,"contexts":..,"stages":..,"micro_batches":..,"threads":..,"hybridize":..,
/// "job_time_s":..,
/// "job_samples_per_s":..,"parameters":..}. Accuracy and loss are the
/// last epoch's; samples_per_s and time_s cover this worker's training loop of every epoch (every
/// worker's samples at this worker's pace); job_samples_per_s is every worker's samples over
/// job_time_s. Measured numbers have 6 significant digits; a test accuracy this process did not
/// measure is null. Precondition: `epochs` is not empty.
std::string final_line(std::span<const epoch_metrics> epochs, const run_summary& run);

/// A header and one row per epoch: epoch,train_loss,train_acc,test_acc,samples_per_s,time_s,
/// learning_rate,samples (an absent test_acc is an empty field).
std::string csv_text(std::span<const epoch_metrics> epochs);
/// Writes csv_text to `path`; errc::io_error naming the path when it cannot.
status write_csv(const std::filesystem::path& path, std::span<const epoch_metrics> epochs);

/// A self-contained SVG document of two panels, loss (left) and accuracy in % (right, train and
/// test), per epoch, with axes, ticks and a legend. `title` heads it. With no epochs the panels
/// are empty but the document is still valid.
std::string svg_plot(std::span<const epoch_metrics> epochs, std::string_view title);
/// Writes svg_plot to `path`; errc::io_error naming the path when it cannot.
status write_svg(const std::filesystem::path& path, std::span<const epoch_metrics> epochs,
                 std::string_view title);

/// "Nice" tick positions covering [low, high] (1, 2 or 5 times a power of ten apart), at most
/// about `max_ticks`; the first is <= low and the last >= high. low == high widens the range.
std::vector<double> nice_ticks(double low, double high, int max_ticks = 6);

/// Progress of one epoch on a stream (stderr by default). On a terminal it redraws one line in
/// place (bar, batches, samples/s, loss, accuracy) at most every 100 ms; otherwise it prints a
/// plain line every `line_interval`, so logs of long runs show progress without control
/// characters. Disabled, it prints nothing.
class progress {
public:
  enum class mode { off, bar, lines };

  /// `mode` nullopt: bar when `stream` is a terminal, lines otherwise.
  progress(std::optional<mode> how = std::nullopt, std::FILE* stream = stderr,
           std::chrono::milliseconds line_interval = std::chrono::seconds(5));

  /// Starts an epoch of `total_batches` batches; `label` prefixes every line ("epoch 3/10").
  void start(std::string label, std::int64_t total_batches);
  /// Reports `batches` done and `samples` trained so far in this epoch, with the running mean
  /// loss and accuracy (%). Cheap when it does not draw.
  void update(std::int64_t batches, std::int64_t samples, double mean_loss, double accuracy);
  /// Ends the epoch: clears the in-place line so the summary line prints on a clean line.
  void finish();

  mode how() const noexcept { return mode_; }

private:
  void draw();

  mode mode_;
  std::FILE* stream_;
  std::chrono::milliseconds line_interval_;
  std::string label_;
  std::int64_t total_ = 0;
  std::int64_t batches_ = 0;
  std::int64_t samples_ = 0;
  double loss_ = 0;
  double accuracy_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool drawn_ = false;
};

} // namespace troupe::report
