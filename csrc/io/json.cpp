#include "io/json.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>
#include <stdexcept>

namespace blockbatch::io {

class JsonParser {
 public:
  explicit JsonParser(const std::string& s) : s_(s) {}

  Json document() {
    Json v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("invalid JSON at byte " + std::to_string(pos_) + ": " + what);
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  bool consume(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (s_.compare(pos_, n, word) == 0) {
      pos_ += n;
      return true;
    }
    return false;
  }

  Json value(int depth) {
    if (depth > 64) fail("nesting deeper than 64");
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end of input");
    Json v;
    char c = s_[pos_];
    if (c == '{') {
      v.type_ = Json::Type::kObject;
      ++pos_;
      skip_ws();
      std::set<std::string> seen;
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        return v;
      }
      while (true) {
        skip_ws();
        if (pos_ >= s_.size() || s_[pos_] != '"') fail("expected a string key");
        std::string key = string();
        if (!seen.insert(key).second) fail("duplicate key '" + key + "'");
        skip_ws();
        if (pos_ >= s_.size() || s_[pos_] != ':') fail("expected ':'");
        ++pos_;
        v.object_.emplace_back(std::move(key), value(depth + 1));
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == '}') {
          ++pos_;
          return v;
        }
        fail("expected ',' or '}'");
      }
    }
    if (c == '[') {
      v.type_ = Json::Type::kArray;
      ++pos_;
      skip_ws();
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return v;
      }
      while (true) {
        v.array_.push_back(value(depth + 1));
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          continue;
        }
        if (pos_ < s_.size() && s_[pos_] == ']') {
          ++pos_;
          return v;
        }
        fail("expected ',' or ']'");
      }
    }
    if (c == '"') {
      v.type_ = Json::Type::kString;
      v.string_ = string();
      return v;
    }
    if (consume("true")) {
      v.type_ = Json::Type::kBool;
      v.bool_ = true;
      return v;
    }
    if (consume("false")) {
      v.type_ = Json::Type::kBool;
      return v;
    }
    if (consume("null")) return v;
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    fail(std::string("unexpected character '") + c + "'");
  }

  Json number() {
    size_t start = pos_;
    bool integer = true;
    if (s_[pos_] == '-') ++pos_;
    if (pos_ >= s_.size() || !isdigit(static_cast<unsigned char>(s_[pos_]))) fail("bad number");
    if (s_[pos_] == '0') {
      ++pos_;
    } else {
      while (pos_ < s_.size() && isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      integer = false;
      ++pos_;
      if (pos_ >= s_.size() || !isdigit(static_cast<unsigned char>(s_[pos_]))) fail("bad fraction");
      while (pos_ < s_.size() && isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      integer = false;
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (pos_ >= s_.size() || !isdigit(static_cast<unsigned char>(s_[pos_]))) fail("bad exponent");
      while (pos_ < s_.size() && isdigit(static_cast<unsigned char>(s_[pos_]))) ++pos_;
    }
    std::string text = s_.substr(start, pos_ - start);
    Json v;
    v.type_ = Json::Type::kNumber;
    v.number_ = std::strtod(text.c_str(), nullptr);
    if (integer) {
      errno = 0;
      long long parsed = std::strtoll(text.c_str(), nullptr, 10);
      if (errno != ERANGE) {
        v.is_integer_ = true;
        v.integer_ = parsed;
      }
    }
    return v;
  }

  void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else fail("bad hex digit in \\u escape");
    }
    return v;
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (pos_ >= s_.size()) fail("unterminated string");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {
            if (!consume("\\u")) fail("unpaired surrogate");
            uint32_t lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) fail("bad low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            fail("unpaired surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }

  const std::string& s_;
  size_t pos_ = 0;
};

namespace {
// RFC 8259 text is UTF-8: the byte offset of the first byte that breaks it, or npos.
size_t invalid_utf8_at(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return i;
    }
    if (i + len > s.size()) return i;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return i;
    i += len;
  }
  return std::string::npos;
}
}  // namespace

Json Json::parse(const std::string& text) {
  const size_t bad = invalid_utf8_at(text);
  if (bad != std::string::npos) {
    throw std::runtime_error("invalid JSON at byte " + std::to_string(bad) + ": not UTF-8 text");
  }
  return JsonParser(text).document();
}

bool Json::as_bool() const {
  if (type_ != Type::kBool) throw std::runtime_error("expected a boolean");
  return bool_;
}
double Json::as_double() const {
  if (type_ != Type::kNumber) throw std::runtime_error("expected a number");
  return number_;
}
int64_t Json::as_int() const {
  if (!is_integer()) throw std::runtime_error("expected an integer");
  return integer_;
}
const std::string& Json::as_string() const {
  if (type_ != Type::kString) throw std::runtime_error("expected a string");
  return string_;
}
const std::vector<Json>& Json::as_array() const {
  if (type_ != Type::kArray) throw std::runtime_error("expected an array");
  return array_;
}
const std::vector<std::pair<std::string, Json>>& Json::as_object() const {
  if (type_ != Type::kObject) throw std::runtime_error("expected an object");
  return object_;
}
bool Json::contains(const std::string& key) const {
  if (type_ != Type::kObject) return false;
  for (const auto& kv : object_) {
    if (kv.first == key) return true;
  }
  return false;
}
const Json& Json::at(const std::string& key) const {
  for (const auto& kv : as_object()) {
    if (kv.first == key) return kv.second;
  }
  throw std::runtime_error("key '" + key + "' is missing");
}

}  // namespace blockbatch::io
