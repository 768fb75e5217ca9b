// The precompiled header of the tests (tests/CMakeLists.txt) needs one source to build with.
