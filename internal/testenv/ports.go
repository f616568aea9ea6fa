package testenv

import (
	"errors"
	"net"
	"sync"
	"testing"
)

// given are the ports this process has handed out: the kernel may pick a port it just freed again, and two picks for
// one server (its client and health ports) then collide ("address already in use", seen in CI).
var given = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// PickFreePort returns a TCP port on 127.0.0.1 that was free a moment ago and that this process has not handed out
// before, for code without a test (a benchmark's main, a TestMain).
func PickFreePort() (int, error) {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		given.Lock()
		fresh := !given.ports[port]
		given.ports[port] = true
		given.Unlock()
		if fresh {
			return port, nil
		}
	}
	return 0, errors.New("free port: every port the kernel offered in 100 tries was handed out before")
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
