package webhook

import (
	"bytes"
	"net/http"
	"strconv"
	"sync"
)

// wholeResponse sends a handler's response in one piece, with a
// Content-Length. admission.Webhook encodes its response straight into the
// http.ResponseWriter, and net/http sends a response body of more than 2 KiB
// (a pod's patch is about 5) with chunked transfer encoding, in two writes
// to the connection: two TLS records, two system calls, and a second wakeup
// of the API server's reader. Measured on the round trip over HTTPS, that
// was as much as the handler's own work (BenchmarkHTTPS).
func wholeResponse(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bw := &bufferedWriter{ResponseWriter: w, buf: buffers.Get().(*bytes.Buffer)}
		defer putBuffer(bw.buf)
		h.ServeHTTP(bw, r)
		w.Header().Set("Content-Length", strconv.Itoa(bw.buf.Len()))
		if bw.status != 0 {
			w.WriteHeader(bw.status)
		}
		_, _ = w.Write(bw.buf.Bytes()) // the client went away: nothing left to tell it
	})
}

type bufferedWriter struct {
	http.ResponseWriter
	buf    *bytes.Buffer
	status int
}

func (b *bufferedWriter) WriteHeader(code int) {
	if b.status == 0 {
		b.status = code
	}
}

func (b *bufferedWriter) Write(p []byte) (int, error) { return b.buf.Write(p) }

// buffers holds the response buffers, kept for the next request.
var buffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func putBuffer(b *bytes.Buffer) {
	// A very large response's buffer is left to the garbage collector.
	if b.Cap() <= 1<<20 {
		b.Reset()
		buffers.Put(b)
	}
}
