"""The C++ toolchain: compiler discovery, flags and atomic compiles (:mod:`.cxx`), and the
parallel candidate compiler with the kernel cache (:mod:`.compiler`)."""
