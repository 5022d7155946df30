// Package inprocess carries HTTP requests to a handler in the same
// process. When the portal and the broker run in one deskway, the portal's
// calls take the broker's whole API path (its guard, its authentication of
// the front-end token, its handlers and logs) without TLS, a socket and
// HTTP framing in between.
package inprocess

import (
	"bytes"
	"fmt"
	"net/http"
)

// RemoteAddr is the caller's address the handler sees: loopback, since
// the caller is this process, with port 0 to tell it from a socket.
const RemoteAddr = "127.0.0.1:0"

// Transport is an http.RoundTripper that serves every request with
// Handler on the caller's goroutine. Answers are buffered whole, which
// suits APIs of small JSON bodies, not streams.
type Transport struct {
	Handler http.Handler
}

// RoundTrip serves req with t.Handler and returns its buffered answer.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.RemoteAddr = RemoteAddr
	r.RequestURI = r.URL.RequestURI()
	r.Host = req.URL.Host
	if r.Body == nil {
		r.Body = http.NoBody
	}
	w := &recorder{header: http.Header{}}
	if err := serve(t.Handler, w, r); err != nil {
		return nil, err
	}
	if req.Body != nil {
		req.Body.Close()
	}
	if err := req.Context().Err(); err != nil {
		return nil, err
	}
	w.WriteHeader(http.StatusOK) // a handler that wrote nothing
	return &http.Response{Status: fmt.Sprintf("%d %s", w.status, http.StatusText(w.status)), StatusCode: w.status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.header, Body: body{bytes.NewReader(w.body.Bytes())}, ContentLength: int64(w.body.Len()), Request: req}, nil
}

// serve runs h as net/http would for one connection: a panic ends that
// request with an error, not the caller's goroutine.
func serve(h http.Handler, w http.ResponseWriter, r *http.Request) (err error) {
	defer func() {
		if p := recover(); p != nil && p != http.ErrAbortHandler {
			err = fmt.Errorf("inprocess: the handler of %s %s panicked: %v", r.Method, r.URL.Path, p)
		} else if p != nil {
			err = fmt.Errorf("inprocess: the handler of %s %s aborted", r.Method, r.URL.Path)
		}
	}()
	h.ServeHTTP(w, r)
	return nil
}

// recorder is the http.ResponseWriter the handler writes to.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *recorder) Header() http.Header { return w.header }

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *recorder) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(p)
}

type body struct{ *bytes.Reader }

func (body) Close() error { return nil }
