package sidecar

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strings"

	"github.com/elastic-training/elastic-training/internal/constants"
)

// On host networking a trainer reaches its own sidecar on Unix sockets in the pod's files volume
// (constants.CheckpointSocket, constants.ProgressSocket): the node's loopback is every host-network pod's, a
// directory of the pod's is its own.

// unixPath is the socket's path of an address "unix:<path>", and whether it is one.
func unixPath(addr string) (string, bool) {
	return strings.CutPrefix(addr, constants.UnixAddrPrefix)
}

// checkUnixPath refuses a socket path that is not absolute or that no socket could bind (sun_path: 108 bytes).
func checkUnixPath(flag, path string) error {
	if !strings.HasPrefix(path, "/") || len(path) >= 108 || strings.ContainsRune(path, 0) {
		return fmt.Errorf("%s %q: want an absolute path of a Unix socket, shorter than 108 bytes", flag, path)
	}
	return nil
}

// listenUnix listens at path, in place of whatever socket is there (this sidecar's own, left by the mode it ran
// before or by a restart), and lets any user of the pod connect: the trainer runs as its own user, and the socket's
// directory is the pod's. Closing the listener leaves the path alone, since the next mode's socket may be there by then.
func listenUnix(network, path string) (net.Listener, net.PacketConn, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, nil, fmt.Errorf("%s: exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, nil, err
		}
	}
	var (
		ln net.Listener
		pc net.PacketConn
	)
	switch network {
	case "unix":
		l, err := net.ListenUnix(network, &net.UnixAddr{Name: path, Net: network})
		if err != nil {
			return nil, nil, err
		}
		l.SetUnlinkOnClose(false)
		ln = l
	case "unixgram":
		c, err := net.ListenUnixgram(network, &net.UnixAddr{Name: path, Net: network})
		if err != nil {
			return nil, nil, err
		}
		pc = c
	default:
		return nil, nil, fmt.Errorf("network %q", network)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		if ln != nil {
			ln.Close()
		} else {
			pc.Close()
		}
		return nil, nil, err
	}
	return ln, pc, nil
}
