// A small JSON reader for package manifests (internal). Strict: malformed text is an error.
#ifndef EMBER_DETAIL_JSON_H_
#define EMBER_DETAIL_JSON_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ember {

class Json {
 public:
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  // Throws EMBER_ERR_PACKAGE (naming `what`) on malformed input.
  static Json parse(const std::string& text, const std::string& what = "JSON");

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == kNull; }
  bool is_integer() const { return kind_ == kNumber && is_int_; }  // fits int64, no fraction
  // Typed accessors throw EMBER_ERR_PACKAGE on a kind mismatch.
  bool as_bool() const;
  double as_number() const;
  int64_t as_int() const;
  const std::string& as_string() const;
  const std::vector<Json>& as_array() const;
  const Json& operator[](const std::string& key) const;  // throws when missing
  bool has(const std::string& key) const;

 private:
  Kind kind_ = kNull;
  bool b_ = false;
  double num_ = 0;
  bool is_int_ = false;
  int64_t int_ = 0;
  std::string str_;
  std::vector<Json> arr_;
  std::map<std::string, Json> obj_;
  friend class JsonParser;
};

}  // namespace ember

#endif  // EMBER_DETAIL_JSON_H_
