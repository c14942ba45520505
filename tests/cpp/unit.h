// The first include of every test file: torch's headers, then doctest. c10/util/Logging.h defines a
// glog-style CHECK (abort on failure, not counted or reported by doctest); it is undefined here so
// that every CHECK in the tests is doctest's, whatever the test includes afterwards.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Logging.h>

#undef CHECK

#include <doctest/doctest.h>
