// Helpers of the generated option code (options_table.cpp): range checks with the table's own
// wording, and the parsers of command-line text. Errors are c10::ValueError naming the option.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace blockbatch {

// "NAME must be RANGE, got VALUE" unless lo <= v <= hi (strict where open); floats must be finite.
void check_range(const char* name, int64_t v, std::optional<int64_t> lo, bool lo_open, std::optional<int64_t> hi,
                 bool hi_open, const char* range);
void check_range(const char* name, double v, std::optional<double> lo, bool lo_open, std::optional<double> hi,
                 bool hi_open, const char* range);
void check_count(const char* name, size_t n, int64_t max_items);
[[noreturn]] void bad_choice(const char* name, std::string_view value, const char* range);

bool is_none(const std::string& text);
int64_t parse_int(const char* name, const std::string& text);
double parse_float(const char* name, const std::string& text);
bool parse_bool(const char* name, const std::string& text);
std::vector<int64_t> parse_int_list(const char* name, const std::string& text);

}  // namespace blockbatch
