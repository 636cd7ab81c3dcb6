// A strict recursive-descent JSON reader (RFC 8259), enough for manifests.
#include "detail/json.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "detail/common.h"

namespace ember {

class JsonParser {
 public:
  JsonParser(const std::string& text, const std::string& what) : s_(text), what_(what) {}

  Json parse_document() {
    Json v = value(0);
    skip_ws();
    if (i_ != s_.size()) error("trailing characters");
    return v;
  }

 private:
  [[noreturn]] void error(const std::string& why) {
    fail(EMBER_ERR_PACKAGE, what_ + " is not valid JSON: " + why + " at byte " + std::to_string(i_));
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t'))
      ++i_;
  }
  bool consume(char c) {
    skip_ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) error(std::string("expected '") + c + "'");
  }
  bool literal(const char* word) {
    size_t n = strlen(word);
    if (s_.compare(i_, n, word) == 0) {
      i_ += n;
      return true;
    }
    return false;
  }

  Json value(int depth) {
    if (depth > 64) error("nesting too deep");
    skip_ws();
    if (i_ >= s_.size()) error("unexpected end");
    Json v;
    char c = s_[i_];
    if (c == '{') {
      ++i_;
      v.kind_ = Json::kObject;
      if (consume('}')) return v;
      do {
        skip_ws();
        std::string key = string();
        expect(':');
        // Readers disagree on which duplicate wins, so a duplicate could show one tool a value
        // and the loader another: rejected.
        if (v.obj_.count(key)) error("duplicate key '" + key.substr(0, 64) + "'");
        v.obj_[key] = value(depth + 1);
      } while (consume(','));
      expect('}');
    } else if (c == '[') {
      ++i_;
      v.kind_ = Json::kArray;
      if (consume(']')) return v;
      do {
        v.arr_.push_back(value(depth + 1));
      } while (consume(','));
      expect(']');
    } else if (c == '"') {
      v.kind_ = Json::kString;
      v.str_ = string();
    } else if (literal("true")) {
      v.kind_ = Json::kBool;
      v.b_ = true;
    } else if (literal("false")) {
      v.kind_ = Json::kBool;
    } else if (literal("null")) {
      v.kind_ = Json::kNull;
    } else {
      number(v);
    }
    return v;
  }

  // RFC 8259 numbers only: no leading zeros, digits after '.' and after an exponent.
  void number(Json& v) {
    size_t start = i_;
    auto digits = [&]() {
      size_t from = i_;
      while (i_ < s_.size() && isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
      return i_ - from;
    };
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    bool integral = true;
    size_t first = i_;
    size_t n = digits();
    if (n == 0) error("unexpected character");
    if (n > 1 && s_[first] == '0') error("leading zero in a number");
    if (i_ < s_.size() && s_[i_] == '.') {
      integral = false;
      ++i_;
      if (digits() == 0) error("no digits after '.'");
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      integral = false;
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (digits() == 0) error("no digits in an exponent");
    }
    std::string text = s_.substr(start, i_ - start);
    v.kind_ = Json::kNumber;
    v.num_ = strtod(text.c_str(), nullptr);
    if (integral) {
      errno = 0;
      long long x = strtoll(text.c_str(), nullptr, 10);
      if (errno == 0) {  // beyond int64 it stays a number, never an integer
        v.is_int_ = true;
        v.int_ = x;
      }
    }
  }

  std::string string() {
    if (i_ >= s_.size() || s_[i_] != '"') error("expected a string");
    ++i_;
    std::string out;
    while (true) {
      if (i_ >= s_.size()) error("unterminated string");
      char c = s_[i_++];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) error("control character in string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= s_.size()) error("unterminated escape");
      char e = s_[i_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': unicode(out); break;
        default: error("bad escape");
      }
    }
    return out;
  }

  void unicode(std::string& out) {
    auto hex4 = [&]() {
      if (i_ + 4 > s_.size()) error("bad \\u escape");
      unsigned v = 0;
      for (int k = 0; k < 4; ++k) {
        char h = s_[i_++];
        v <<= 4;
        if (h >= '0' && h <= '9') v |= h - '0';
        else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
        else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
        else error("bad \\u escape");
      }
      return v;
    };
    unsigned cp = hex4();
    if (cp >= 0xDC00 && cp <= 0xDFFF) error("lone surrogate");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (!literal("\\u")) error("lone surrogate");
      unsigned lo = hex4();
      if (lo < 0xDC00 || lo > 0xDFFF) error("lone surrogate");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    if (cp < 0x80) {
      out.push_back(char(cp));
    } else if (cp < 0x800) {
      out.push_back(char(0xC0 | (cp >> 6)));
      out.push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(char(0xE0 | (cp >> 12)));
      out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(char(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(char(0xF0 | (cp >> 18)));
      out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(char(0x80 | (cp & 0x3F)));
    }
  }

  const std::string& s_;
  std::string what_;
  size_t i_ = 0;
};

Json Json::parse(const std::string& text, const std::string& what) {
  return JsonParser(text, what).parse_document();
}

namespace {
[[noreturn]] void kind_error(const char* want) {
  fail(EMBER_ERR_PACKAGE, std::string("manifest: expected a JSON ") + want);
}
}  // namespace

bool Json::as_bool() const {
  if (kind_ != kBool) kind_error("boolean");
  return b_;
}
double Json::as_number() const {
  if (kind_ != kNumber) kind_error("number");
  return num_;
}
int64_t Json::as_int() const {
  if (kind_ != kNumber || !is_int_) kind_error("integer");
  return int_;
}
const std::string& Json::as_string() const {
  if (kind_ != kString) kind_error("string");
  return str_;
}
const std::vector<Json>& Json::as_array() const {
  if (kind_ != kArray) kind_error("array");
  return arr_;
}
const Json& Json::operator[](const std::string& key) const {
  if (kind_ != kObject) kind_error("object");
  auto it = obj_.find(key);
  if (it == obj_.end()) fail(EMBER_ERR_PACKAGE, "manifest: missing key '" + key + "'");
  return it->second;
}
bool Json::has(const std::string& key) const {
  return kind_ == kObject && obj_.count(key) != 0;
}

}  // namespace ember
