// Tests of the IDX reader and of mnist_iter on small IDX files written here, plain and
// gzip-compressed, with known pixels; and, where it is installed, on the real Fashion-MNIST.

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>
#include <zlib.h>

#include <boost/test/unit_test.hpp>

#include "engine/data/idx.hpp"
#include "engine/data/mnist_iter.hpp"
#include "tests/temp_dir.hpp"

namespace fs = std::filesystem;
using troupe::errc;
using troupe::data::batch;
using troupe::data::last_batch_mode;
using troupe::data::mnist_iter;
using troupe::data::mnist_options;
using troupe::data::part_range;
using troupe::data::read_idx_images;
using troupe::data::read_idx_labels;

using troupe::testing::temp_dir;

namespace {

using bytes = std::vector<std::uint8_t>;

void put_word(bytes& out, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<std::uint8_t>(value >> shift));
}

/// An IDX image file's bytes: the header as given (it may lie), then `pixels`.
bytes idx_image_bytes(std::uint32_t count, std::uint32_t rows, std::uint32_t cols,
                      const bytes& pixels, std::uint32_t magic = 0x00000803) {
  bytes out;
  put_word(out, magic);
  put_word(out, count);
  put_word(out, rows);
  put_word(out, cols);
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

bytes idx_label_bytes(std::uint32_t count, const bytes& labels, std::uint32_t magic = 0x00000801) {
  bytes out;
  put_word(out, magic);
  put_word(out, count);
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

/// Writes `content` to `path`, through zlib's gzwrite when `gzip`; returns the path.
fs::path write_file(const fs::path& path, const bytes& content, bool gzip) {
  if (gzip) {
    gzFile file = gzopen(path.c_str(), "wb");
    BOOST_REQUIRE(file != nullptr);
    if (!content.empty())
      BOOST_REQUIRE(gzwrite(file, content.data(), static_cast<unsigned>(content.size())) ==
                    static_cast<int>(content.size()));
    BOOST_REQUIRE(gzclose(file) == Z_OK);
  } else {
    std::ofstream out{path, std::ios::binary};
    out.write(reinterpret_cast<const char*>(content.data()),
              static_cast<std::streamsize>(content.size()));
    BOOST_REQUIRE(out.good());
  }
  return path;
}

bytes read_raw(const fs::path& path) {
  std::ifstream in{path, std::ios::binary};
  return bytes{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
}

/// Checks that `outcome` failed with `code` and a message containing each of `fragments`.
template <class Result>
void check_error(const Result& outcome, errc code, std::initializer_list<std::string> fragments) {
  BOOST_REQUIRE(!outcome.has_value());
  BOOST_TEST(to_string(outcome.error().code()) == to_string(code));
  const std::string& message = outcome.error().message();
  for (const auto& fragment : fragments)
    BOOST_TEST(message.find(fragment) != std::string::npos,
               "message \"" << message << "\" does not contain \"" << fragment << "\"");
}

/// A data set of `count` 2x2 images whose four pixels are the bytes of the sample's index (low
/// byte first), so that a batch row names its sample; label of sample i is i % 10.
struct indexed_set {
  fs::path images;
  fs::path labels;
};

indexed_set write_indexed_set(const temp_dir& dir, std::uint32_t count, bool gzip = false) {
  bytes pixels;
  bytes labels;
  pixels.reserve(std::size_t{count} * 4);
  for (std::uint32_t i = 0; i < count; ++i) {
    for (int b = 0; b < 4; ++b)
      pixels.push_back(static_cast<std::uint8_t>(i >> (8 * b)));
    labels.push_back(static_cast<std::uint8_t>(i % 10));
  }
  const std::string suffix = std::to_string(count) + (gzip ? ".gz" : "");
  return {write_file(dir / ("images" + suffix), idx_image_bytes(count, 2, 2, pixels), gzip),
          write_file(dir / ("labels" + suffix), idx_label_bytes(count, labels), gzip)};
}

/// The sample index each real (non-filler) row of `b` encodes, for an indexed_set read unscaled.
std::vector<std::int64_t> sample_indices(const batch& b) {
  const auto data = b.data.to_vector<float>();
  const auto rows = b.data.shape()[0];
  const auto width = static_cast<std::int64_t>(data.size()) / rows;
  std::vector<std::int64_t> out;
  for (std::int64_t row = 0; row < rows - b.pad; ++row) {
    std::int64_t index = 0;
    for (int p = 0; p < 4; ++p)
      index |= static_cast<std::int64_t>(data[static_cast<std::size_t>(row * width + p)])
               << (8 * p);
    out.push_back(index);
  }
  return out;
}

/// The samples of one epoch, in the order next() hands them out.
std::vector<std::int64_t> epoch_order(mnist_iter& iter) {
  std::vector<std::int64_t> order;
  while (auto b = iter.next()) {
    const auto indices = sample_indices(*b);
    order.insert(order.end(), indices.begin(), indices.end());
  }
  return order;
}

mnist_options indexed_options(const indexed_set& set) {
  mnist_options options;
  options.image_path = set.images;
  options.label_path = set.labels;
  options.scale = false;
  options.shuffle = false;
  return options;
}

constexpr const char* fashion_train_images = "/usr/share/datasets/fashion-mnist/"
                                             "train-images-idx3-ubyte.gz";
constexpr const char* fashion_train_labels = "/usr/share/datasets/fashion-mnist/"
                                             "train-labels-idx1-ubyte.gz";

boost::test_tools::assertion_result fashion_mnist_present(boost::unit_test::test_unit_id) {
  if (fs::exists(fashion_train_images) && fs::exists(fashion_train_labels))
    return true;
  BOOST_TEST_MESSAGE("skipping: Fashion-MNIST is not installed at " << fashion_train_images);
  boost::test_tools::assertion_result result{false};
  result.message() << fashion_train_images << " does not exist";
  return result;
}

} // namespace

BOOST_AUTO_TEST_SUITE(idx_suite)

BOOST_AUTO_TEST_CASE(an_image_file_reads_back_exactly_whether_plain_or_gzip_compressed) {
  temp_dir dir;
  bytes pixels(3 * 4 * 5);
  for (std::size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<std::uint8_t>(i * 37 + 11);
  for (bool gzip : {false, true}) {
    const auto path =
        write_file(dir / (gzip ? "images.gz" : "images"), idx_image_bytes(3, 4, 5, pixels), gzip);
    if (gzip)
      BOOST_TEST(read_raw(path).size() >= 2);
    auto images = read_idx_images(path);
    BOOST_REQUIRE(images.has_value());
    BOOST_TEST(images->count == 3);
    BOOST_TEST(images->rows == 4);
    BOOST_TEST(images->cols == 5);
    BOOST_TEST(images->pixels == pixels, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(a_label_file_reads_back_exactly_whether_plain_or_gzip_compressed) {
  temp_dir dir;
  const bytes labels{0, 9, 3, 255, 7, 1, 1};
  for (bool gzip : {false, true}) {
    const auto path =
        write_file(dir / (gzip ? "labels.gz" : "labels"), idx_label_bytes(7, labels), gzip);
    auto read = read_idx_labels(path);
    BOOST_REQUIRE(read.has_value());
    BOOST_TEST(*read == labels, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(a_file_of_zero_samples_reads_as_empty) {
  temp_dir dir;
  auto images = read_idx_images(write_file(dir / "images", idx_image_bytes(0, 28, 28, {}), true));
  BOOST_REQUIRE(images.has_value());
  BOOST_TEST(images->count == 0);
  BOOST_TEST(images->pixels.empty());
  auto labels = read_idx_labels(write_file(dir / "labels", idx_label_bytes(0, {}), false));
  BOOST_REQUIRE(labels.has_value());
  BOOST_TEST(labels->empty());
}

BOOST_AUTO_TEST_CASE(a_wrong_magic_is_corrupt_data_naming_the_file_and_the_magic) {
  temp_dir dir;
  for (bool gzip : {false, true}) {
    const auto labels = write_file(dir / "labels", idx_label_bytes(2, {1, 2}), gzip);
    check_error(read_idx_images(labels), errc::corrupt_data,
                {labels.string(), "0x00000801", "label file"});
    const auto images = write_file(dir / "images", idx_image_bytes(1, 1, 1, {5}), gzip);
    check_error(read_idx_labels(images), errc::corrupt_data,
                {images.string(), "0x00000803", "image file"});
    const auto junk = write_file(dir / "junk", idx_image_bytes(1, 1, 1, {5}, 0xdeadbeef), gzip);
    check_error(read_idx_images(junk), errc::corrupt_data, {junk.string(), "0xdeadbeef"});
  }
}

BOOST_AUTO_TEST_CASE(a_truncated_file_is_corrupt_data_naming_the_file) {
  temp_dir dir;
  const bytes pixels(2 * 3 * 3, 200);
  const bytes whole = idx_image_bytes(2, 3, 3, pixels);
  for (bool gzip : {false, true}) {
    // Cut inside the header, at the end of the header, and inside the pixels.
    for (std::size_t keep :
         {std::size_t{0}, std::size_t{2}, std::size_t{9}, std::size_t{16}, whole.size() - 1}) {
      const auto path = write_file(dir / ("cut" + std::to_string(keep)),
                                   bytes(whole.begin(), whole.begin() + keep), gzip);
      check_error(read_idx_images(path), errc::corrupt_data, {path.string(), "truncated"});
    }
    const auto labels = write_file(dir / "labels", idx_label_bytes(5, {1, 2, 3}), gzip);
    check_error(read_idx_labels(labels), errc::corrupt_data,
                {labels.string(), "truncated", "announces 5 bytes", "holds 3"});
  }
}

BOOST_AUTO_TEST_CASE(a_gzip_stream_cut_short_is_corrupt_data_naming_the_file) {
  temp_dir dir;
  bytes pixels(10 * 28 * 28);
  for (std::size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<std::uint8_t>(i * 7919 >> 3);
  const auto whole = write_file(dir / "whole.gz", idx_image_bytes(10, 28, 28, pixels), true);
  const bytes compressed = read_raw(whole);
  BOOST_REQUIRE(compressed.size() > 40);
  const auto cut = write_file(
      dir / "cut.gz", bytes(compressed.begin(), compressed.begin() + compressed.size() / 2), false);
  check_error(read_idx_images(cut), errc::corrupt_data, {cut.string()});
}

BOOST_AUTO_TEST_CASE(dimensions_that_disagree_with_the_file_size_are_corrupt_data) {
  temp_dir dir;
  for (bool gzip : {false, true}) {
    // More bytes than announced.
    const auto extra = write_file(dir / "extra", idx_image_bytes(1, 2, 2, bytes(5, 1)), gzip);
    check_error(read_idx_images(extra), errc::corrupt_data, {extra.string(), "more than the 4"});
    // Extents whose product overflows 64 bits, and one that merely exceeds the limit: refused
    // before anything is allocated.
    const auto overflow =
        write_file(dir / "overflow", idx_image_bytes(0xffffffff, 0xffffffff, 0xffffffff, {}), gzip);
    check_error(read_idx_images(overflow), errc::corrupt_data, {overflow.string(), "limit"});
    const auto huge = write_file(dir / "huge", idx_image_bytes(60000000, 28, 28, {}), gzip);
    check_error(read_idx_images(huge), errc::corrupt_data,
                {huge.string(), "60000000 x 28 x 28", "limit"});
    // Plausible extents on a file far too short for them: truncated, after reading what's there.
    const auto lying = write_file(dir / "lying", idx_image_bytes(60000, 28, 28, bytes(100)), gzip);
    check_error(read_idx_images(lying), errc::corrupt_data,
                {lying.string(), "truncated", "announces 47040000 bytes", "holds 100"});
    const auto empty_images = write_file(dir / "zero", idx_image_bytes(3, 0, 28, {}), gzip);
    check_error(read_idx_images(empty_images), errc::corrupt_data,
                {empty_images.string(), "zero size"});
    const auto labels = write_file(dir / "labels", idx_label_bytes(0xffffffff, {1}), gzip);
    check_error(read_idx_labels(labels), errc::corrupt_data, {labels.string(), "limit"});
  }
}

BOOST_AUTO_TEST_CASE(a_missing_file_is_an_io_error_naming_the_path_and_the_reason) {
  temp_dir dir;
  const auto missing = dir / "no-such-file.gz";
  check_error(read_idx_images(missing), errc::io_error,
              {missing.string(), "No such file or directory"});
  check_error(read_idx_labels(missing), errc::io_error,
              {missing.string(), "No such file or directory"});
  // A directory opens but cannot be read.
  const auto directory = dir / "a-directory";
  fs::create_directories(directory);
  check_error(read_idx_images(directory), errc::io_error, {directory.string(), "Is a directory"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(mnist_iter_suite)

BOOST_AUTO_TEST_CASE(parts_follow_mxnets_rounding_of_count_times_k_over_n) {
  using range = std::pair<std::int64_t, std::int64_t>;
  // 7 / 3 = 2.33 and 14 / 3 = 4.67 round to 2 and 5.
  BOOST_TEST((part_range(7, 3, 0) == range{0, 2}));
  BOOST_TEST((part_range(7, 3, 1) == range{2, 5}));
  BOOST_TEST((part_range(7, 3, 2) == range{5, 7}));
  // 60000 / 7 = 8571.43, 2 * 60000 / 7 = 17142.86.
  BOOST_TEST((part_range(60000, 7, 0) == range{0, 8571}));
  BOOST_TEST((part_range(60000, 7, 1) == range{8571, 17143}));
  BOOST_TEST((part_range(60000, 7, 6) == range{51429, 60000}));
  // Halves round away from zero: 1 * 1 / 2 = 0.5 -> 1.
  BOOST_TEST((part_range(1, 2, 0) == range{0, 1}));
  BOOST_TEST((part_range(1, 2, 1) == range{1, 1}));
}

BOOST_AUTO_TEST_CASE(the_parts_cover_every_sample_exactly_once_for_any_count_and_part_count) {
  temp_dir dir;
  for (std::uint32_t count : {0u, 1u, 7u, 100u, 60000u}) {
    const auto set = write_indexed_set(dir, count, count == 100);
    for (std::int64_t parts : {1, 2, 3, 4, 7}) {
      std::vector<int> seen(count, 0);
      std::int64_t expected_begin = 0;
      for (std::int64_t part = 0; part < parts; ++part) {
        auto options = indexed_options(set);
        options.num_parts = parts;
        options.part_index = part;
        options.batch_size = 64;
        options.last_batch = last_batch_mode::pad;
        options.shuffle = part % 2 == 1; // the cover must not depend on the order
        auto iter = mnist_iter::open(options);
        BOOST_REQUIRE(iter.has_value());
        const auto [begin, end] = part_range(count, parts, part);
        BOOST_TEST(begin == expected_begin);
        expected_begin = end;
        BOOST_TEST(iter->first_sample() == begin);
        BOOST_TEST(iter->num_samples() == end - begin);
        for (const auto index : epoch_order(*iter)) {
          BOOST_REQUIRE(index >= begin);
          BOOST_REQUIRE(index < end);
          ++seen[static_cast<std::size_t>(index)];
        }
      }
      BOOST_TEST(expected_begin == std::int64_t{count});
      BOOST_TEST(std::count(seen.begin(), seen.end(), 1) == std::int64_t{count},
                 "count " << count << ", " << parts
                          << " parts: not every sample seen exactly once");
    }
  }
}

BOOST_AUTO_TEST_CASE(batches_have_the_right_shapes_labels_and_pixels_scaled_to_0_1) {
  temp_dir dir;
  // 10 images of 3x2, pixel p of image i = (i * 6 + p) * 4 % 256, labels 9 - i.
  bytes pixels;
  bytes labels;
  for (int i = 0; i < 10; ++i) {
    for (int p = 0; p < 6; ++p)
      pixels.push_back(static_cast<std::uint8_t>((i * 6 + p) * 4 % 256));
    labels.push_back(static_cast<std::uint8_t>(9 - i));
  }
  pixels[0] = 255; // the top of the range maps to exactly 1
  mnist_options options;
  options.image_path = write_file(dir / "images.gz", idx_image_bytes(10, 3, 2, pixels), true);
  options.label_path = write_file(dir / "labels", idx_label_bytes(10, labels), false);
  options.shuffle = false;
  options.batch_size = 4;
  options.num_parts = 2;
  options.part_index = 1; // samples [5, 10)
  auto iter = mnist_iter::open(options);
  BOOST_REQUIRE(iter.has_value());
  BOOST_TEST(iter->num_samples() == 5);
  BOOST_TEST(iter->num_batches() == 1);
  BOOST_TEST(iter->rows() == 3);
  BOOST_TEST(iter->cols() == 2);
  auto b = iter->next();
  BOOST_REQUIRE(b.has_value());
  BOOST_TEST((b->data.shape() == troupe::shape_vector{4, 1, 3, 2}));
  BOOST_TEST((b->label.shape() == troupe::shape_vector{4}));
  BOOST_TEST(b->data.dtype() == troupe::dtype::float32);
  BOOST_TEST(b->label.dtype() == troupe::dtype::float32);
  BOOST_TEST(b->pad == 0);
  const auto data = b->data.to_vector<float>();
  const auto label = b->label.to_vector<float>();
  for (int row = 0; row < 4; ++row) {
    const int sample = 5 + row;
    BOOST_TEST(label[static_cast<std::size_t>(row)] == static_cast<float>(9 - sample));
    for (int p = 0; p < 6; ++p)
      BOOST_TEST(data[static_cast<std::size_t>(row * 6 + p)] ==
                 static_cast<float>(pixels[static_cast<std::size_t>(sample * 6 + p)]) / 255.0f);
  }
  BOOST_TEST(!iter->next().has_value()); // the fifth sample is a partial batch: discarded

  // Flat and unscaled; the whole set in part 0 of 1, with pixel 255 kept as 255.
  options.flat = true;
  options.scale = false;
  options.num_parts = 1;
  options.part_index = 0;
  auto flat = mnist_iter::open(options);
  BOOST_REQUIRE(flat.has_value());
  auto first = flat->next();
  BOOST_REQUIRE(first.has_value());
  BOOST_TEST((first->data.shape() == troupe::shape_vector{4, 6}));
  const auto raw = first->data.to_vector<float>();
  BOOST_TEST(raw[0] == 255.0f);
  for (std::size_t i = 0; i < raw.size(); ++i)
    BOOST_TEST(raw[i] == static_cast<float>(pixels[i]));
}

BOOST_AUTO_TEST_CASE(the_same_seed_gives_the_same_orders_and_epochs_differ) {
  temp_dir dir;
  const auto set = write_indexed_set(dir, 100);
  auto options = indexed_options(set);
  options.shuffle = true;
  options.seed = 42;
  options.batch_size = 10;
  auto a = mnist_iter::open(options).value();
  auto b = mnist_iter::open(options).value();
  options.seed = 43;
  auto c = mnist_iter::open(options).value();
  std::vector<std::vector<std::int64_t>> epochs;
  for (int epoch = 0; epoch < 3; ++epoch) {
    if (epoch > 0) {
      a.reset();
      b.reset();
      c.reset();
    }
    BOOST_TEST(a.epoch() == epoch);
    const auto order_a = epoch_order(a);
    const auto order_b = epoch_order(b);
    const auto order_c = epoch_order(c);
    BOOST_TEST(order_a == order_b, boost::test_tools::per_element());
    BOOST_TEST(order_a != order_c);
    BOOST_TEST(std::set<std::int64_t>(order_a.begin(), order_a.end()).size() == 100u);
    for (const auto& earlier : epochs)
      BOOST_TEST(order_a != earlier);
    epochs.push_back(order_a);
  }
  // Without shuffling, every epoch is the file's order.
  options.shuffle = false;
  auto plain = mnist_iter::open(options).value();
  plain.reset();
  const auto order = epoch_order(plain);
  BOOST_REQUIRE(order.size() == 100u);
  for (std::size_t i = 0; i < order.size(); ++i)
    BOOST_TEST(order[i] == static_cast<std::int64_t>(i));
}

BOOST_AUTO_TEST_CASE(discard_drops_the_last_partial_batch_and_pad_fills_it_by_wrapping_around) {
  temp_dir dir;
  const auto set = write_indexed_set(dir, 10);
  auto options = indexed_options(set);
  options.batch_size = 4;
  auto discard = mnist_iter::open(options).value();
  BOOST_TEST(discard.num_batches() == 2);
  std::vector<std::int64_t> seen;
  int batches = 0;
  while (auto b = discard.next()) {
    ++batches;
    BOOST_TEST(b->pad == 0);
    const auto indices = sample_indices(*b);
    seen.insert(seen.end(), indices.begin(), indices.end());
  }
  BOOST_TEST(batches == 2);
  BOOST_TEST(seen == (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7}),
             boost::test_tools::per_element());
  BOOST_TEST(!discard.next().has_value()); // stays exhausted until reset()
  discard.reset();
  BOOST_TEST(discard.next().has_value());

  options.last_batch = last_batch_mode::pad;
  auto pad = mnist_iter::open(options).value();
  BOOST_TEST(pad.num_batches() == 3);
  pad.next();
  pad.next();
  auto last = pad.next();
  BOOST_REQUIRE(last.has_value());
  BOOST_TEST(last->pad == 2);
  BOOST_TEST((last->data.shape() == troupe::shape_vector{4, 1, 2, 2}));
  // Filler rows repeat the epoch's first samples, labels included.
  const auto label = last->label.to_vector<float>();
  BOOST_TEST(label == (std::vector<float>{8, 9, 0, 1}), boost::test_tools::per_element());
  BOOST_TEST(!pad.next().has_value());

  // A part smaller than one batch wraps more than once.
  options.batch_size = 25;
  auto small = mnist_iter::open(options).value();
  BOOST_TEST(small.num_batches() == 1);
  auto only = small.next();
  BOOST_REQUIRE(only.has_value());
  BOOST_TEST(only->pad == 15);
  const auto wrapped = only->label.to_vector<float>();
  for (std::size_t i = 0; i < wrapped.size(); ++i)
    BOOST_TEST(wrapped[i] == static_cast<float>(i % 10));
  options.last_batch = last_batch_mode::discard;
  auto none = mnist_iter::open(options).value();
  BOOST_TEST(none.num_batches() == 0);
  BOOST_TEST(!none.next().has_value());
}

BOOST_AUTO_TEST_CASE(bad_options_and_mismatched_files_are_refused) {
  temp_dir dir;
  const auto set = write_indexed_set(dir, 10);
  auto options = indexed_options(set);
  options.batch_size = 0;
  check_error(mnist_iter::open(options), errc::invalid_argument, {"batch_size"});
  options.batch_size = 1;
  options.num_parts = 0;
  check_error(mnist_iter::open(options), errc::invalid_argument, {"num_parts"});
  options.num_parts = 3;
  options.part_index = 3;
  check_error(mnist_iter::open(options), errc::invalid_argument, {"part_index 3"});
  options.part_index = 0;
  const auto other = write_indexed_set(dir, 7);
  options.label_path = other.labels;
  check_error(mnist_iter::open(options), errc::corrupt_data,
              {set.images.string(), "10 images", other.labels.string(), "7 labels"});
  options.label_path = dir / "missing";
  check_error(mnist_iter::open(options), errc::io_error, {(dir / "missing").string()});
}

BOOST_AUTO_TEST_CASE(the_fashion_mnist_training_set_holds_60000_images_of_ten_balanced_classes,
                     *boost::unit_test::precondition(fashion_mnist_present)) {
  auto images = read_idx_images(fashion_train_images);
  BOOST_REQUIRE(images.has_value());
  BOOST_TEST(images->count == 60000);
  BOOST_TEST(images->rows == 28);
  BOOST_TEST(images->cols == 28);
  mnist_options options;
  options.image_path = fashion_train_images;
  options.label_path = fashion_train_labels;
  options.batch_size = 64;
  options.seed = 1;
  auto iter = mnist_iter::open(options);
  BOOST_REQUIRE(iter.has_value());
  BOOST_TEST(iter->num_samples() == 60000);
  BOOST_TEST(iter->num_batches() == 937);
  std::array<std::int64_t, 10> per_class{};
  std::int64_t batches = 0;
  float low = 1;
  float high = 0;
  while (auto b = iter->next()) {
    ++batches;
    for (const float label : b->label.to_vector<float>()) {
      BOOST_REQUIRE(label >= 0);
      BOOST_REQUIRE(label <= 9);
      ++per_class[static_cast<std::size_t>(label)];
    }
    for (const float pixel : b->data.to_vector<float>()) {
      low = std::min(low, pixel);
      high = std::max(high, pixel);
    }
  }
  BOOST_TEST(batches == 937);
  // 937 * 64 = 59968 of 60000 seen (the last 32 discarded); Fashion-MNIST has 6000 per class.
  for (const auto n : per_class) {
    BOOST_TEST(n >= 5950);
    BOOST_TEST(n <= 6000);
  }
  BOOST_TEST(low == 0.0f);
  BOOST_TEST(high == 1.0f);
}

BOOST_AUTO_TEST_SUITE_END()
