// How doctest prints the values the decoder tests compare (vectors of positions, commits, KV modes).
#pragma once

#include "unit.h"

#include <cstdint>
#include <string>
#include <vector>

#include "model/network.h"

namespace doctest {

template <>
struct StringMaker<std::vector<int64_t>> {
  static String convert(const std::vector<int64_t>& v) {
    std::string s = "{";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return (s + "}").c_str();
  }
};

template <>
struct StringMaker<std::vector<std::vector<int64_t>>> {
  static String convert(const std::vector<std::vector<int64_t>>& v) {
    std::string s = "{";
    for (size_t i = 0; i < v.size(); ++i)
      s += (i ? ", " : "") + std::string(StringMaker<std::vector<int64_t>>::convert(v[i]).c_str());
    return (s + "}").c_str();
  }
};

template <>
struct StringMaker<std::vector<blockbatch::KvMode>> {
  static String convert(const std::vector<blockbatch::KvMode>& v) {
    static const char* names[] = {"full", "dual", "prefix"};
    std::string s = "{";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::string(names[static_cast<int>(v[i])]);
    return (s + "}").c_str();
  }
};

}  // namespace doctest
