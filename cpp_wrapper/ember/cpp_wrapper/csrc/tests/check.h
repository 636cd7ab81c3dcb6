// What the C++ test programs share: expect() records a failed check, done() reports them
// (each test is a plain program for Bazel's cc_test, with no test framework offline).
#ifndef EMBER_TESTS_CHECK_H_
#define EMBER_TESTS_CHECK_H_

#include <cstdio>

namespace check {

inline int failures = 0;

inline void expect(bool ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAIL: %s\n", what);
    ++failures;
  }
}

// main's return value; prints "NAME: all checks passed" when none failed.
inline int done(const char* name) {
  if (failures == 0) printf("%s: all checks passed\n", name);
  return failures == 0 ? 0 : 1;
}

}  // namespace check

#endif  // EMBER_TESTS_CHECK_H_
