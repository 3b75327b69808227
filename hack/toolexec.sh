#!/bin/sh
# toolexec.sh PROGRAM ARGS...: go's -toolexec for every build of the tree (the Makefile's GOFLAGS, and
# hack/cluster/build.sh's): runs the toolchain's programs (compile, link, asm, vet) with GOGC=400, so that
# their garbage collector runs about a quarter as often. Building crust's binaries from an empty build
# cache took 368 CPU-seconds so, against 417 and 476 with Go's default (GOGC=1000: 369), and 1.24 GB at
# most against 1.18. The tests and binaries a build makes are not toolchain programs: they keep Go's
# default. It changes no build's output or cache key (go asks the tool itself for its version).
GOGC=400 exec "$@"
