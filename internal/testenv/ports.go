package testenv

import (
	"net"
	"testing"
)

// PickFreePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// for code without a test (a benchmark's main, a TestMain).
func PickFreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreePort is PickFreePort for tests: it fails the test on error.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := PickFreePort()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return port
}
