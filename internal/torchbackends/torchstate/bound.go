package torchstate

import (
	"encoding/binary"
	"fmt"
)

// Sizes of each opcode's argument (pickletools' table): a fixed size, or a
// length of lenSize bytes followed by that many bytes, or lines.
type argKind struct {
	fixed   int // bytes
	lenSize int // little-endian length prefix of 1, 4 or 8 bytes
	lines   int // newline-terminated arguments
	frame   bool
}

var opArgs = map[byte]argKind{
	'F': {lines: 1}, 'I': {lines: 1}, 'L': {lines: 1}, 'P': {lines: 1}, 'S': {lines: 1}, 'V': {lines: 1},
	'g': {lines: 1}, 'p': {lines: 1}, 'c': {lines: 2}, 'i': {lines: 2},
	'J': {fixed: 4}, 'K': {fixed: 1}, 'M': {fixed: 2}, 'h': {fixed: 1}, 'j': {fixed: 4}, 'q': {fixed: 1},
	'r': {fixed: 4}, 'G': {fixed: 8}, '\x80': {fixed: 1}, '\x82': {fixed: 1}, '\x83': {fixed: 2}, '\x84': {fixed: 4},
	'U': {lenSize: 1}, 'C': {lenSize: 1}, '\x8c': {lenSize: 1}, '\x8a': {lenSize: 1},
	'T': {lenSize: 4}, 'X': {lenSize: 4}, 'B': {lenSize: 4}, '\x8b': {lenSize: 4},
	'\x8d': {lenSize: 8}, '\x8e': {lenSize: 8}, '\x96': {lenSize: 8},
	'\x95': {lenSize: 8, frame: true},
}

// Bounds on what torch's state never needs, each a cost to a reader:
// gopickle converts a long integer in time quadratic in its length (a LONG4
// of 256 KiB took 4.9 s), and parses every text argument whole. torch's
// integers (rounds, PIDs, local ids, datetime fields) fit in 64 bits: LONG1
// of at most 9 bytes; protocol 2's text arguments are module and class names.
const (
	maxLongBytes = 9
	maxLineBytes = 256
)

// checkLengths walks the opcodes and refuses a length that claims more bytes
// than the pickle has left (gopickle allocates what a length claims before it
// reads, so without this 20 bytes could ask for terabytes), an integer longer
// than maxLongBytes and a text argument longer than maxLineBytes.
func checkLengths(raw []byte) error {
	for i := 0; i < len(raw); {
		op := raw[i]
		i++
		if op == '.' {
			return nil
		}
		a := opArgs[op]
		switch {
		case a.lines > 0:
			for range a.lines {
				start := i
				for i < len(raw) && raw[i] != '\n' {
					i++
				}
				if i-start > maxLineBytes {
					return fmt.Errorf("opcode %#x has an argument of %d bytes, more than torch's state holds (%d)", op, i-start, maxLineBytes)
				}
				i++
			}
		case a.fixed > 0:
			i += a.fixed
		case a.lenSize > 0:
			if i+a.lenSize > len(raw) {
				return fmt.Errorf("pickle ends inside the length of opcode %#x", op)
			}
			var n uint64
			switch a.lenSize {
			case 1:
				n = uint64(raw[i])
			case 4:
				n = uint64(binary.LittleEndian.Uint32(raw[i:]))
			case 8:
				n = binary.LittleEndian.Uint64(raw[i:])
			}
			i += a.lenSize
			if n > uint64(len(raw)-i) {
				return fmt.Errorf("opcode %#x claims %d bytes, the pickle has %d left", op, n, len(raw)-i)
			}
			if (op == '\x8a' || op == '\x8b') && n > maxLongBytes {
				return fmt.Errorf("an integer of %d bytes, longer than torch's state holds (%d)", n, maxLongBytes)
			}
			if !a.frame { // a frame's bytes are opcodes: walk into them
				i += int(n)
			}
		}
	}
	return nil
}
