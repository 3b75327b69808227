// Package testutil holds what tests across crust's modules share and nothing ships: a loop device detached
// when the test ends (Loop, and with a partition PartitionedLoop), a short directory for unix sockets
// (SocketDir), a listener on one (Listen) and the skip of a test not run as root (RequireRoot). Its
// subpackages are test doubles: katatest (Kata's direct-volume vectors and a Kata shim), safedirtest (a
// tree that must stay untouched through a planted link), critest (a CRI runtime service) and sandbox (a
// microVM handler that claims deferred volumes); harness starts crust's binaries and waits on their
// readiness, and crustdtest runs crustd inside a test binary. Each helper either succeeds or fails the
// test; a helper that needs root skips a test run by another user.
package testutil
