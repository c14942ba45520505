// bb_unit_tests: the C++ unit tests (doctest). Run by tests/tools/test_cpp_units.py; alone:
//   build/bin/bb_unit_tests            (every case; --help: doctest's options, e.g. -tc="block*")
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
