package inprocess

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var seen *http.Request
	var got string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = r
		b, _ := io.ReadAll(r.Body)
		got = string(b)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTeapot)
		_, _ = io.WriteString(w, `{"ok":true}`)
		w.WriteHeader(http.StatusOK) // too late: ignored, as net/http does
	})
	c := &http.Client{Transport: &Transport{Handler: h}}
	req, _ := http.NewRequest("POST", "https://broker.local/api/v1/launch?x=1", strings.NewReader("hello"))
	req.Header.Set("Authorization", "Bearer t")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTeapot || resp.Status != "418 I'm a teapot" || string(b) != `{"ok":true}` || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("answer %d %q %v", resp.StatusCode, b, resp.Header)
	}
	if got != "hello" || seen.RemoteAddr != RemoteAddr || seen.RequestURI != "/api/v1/launch?x=1" || seen.Header.Get("Authorization") != "Bearer t" || seen.Host != "broker.local" {
		t.Fatalf("handler saw body %q, remote %q, URI %q, header %v, host %q", got, seen.RemoteAddr, seen.RequestURI, seen.Header, seen.Host)
	}
}

func TestSilentHandlerIsOK(t *testing.T) {
	c := &http.Client{Transport: &Transport{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})}}
	resp, err := c.Get("https://x/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestCanceledRequestFails(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c := &http.Client{Transport: &Transport{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { cancel() })}}
	req, _ := http.NewRequestWithContext(ctx, "GET", "https://x/", nil)
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("a request canceled while served answered")
	}
}

func TestPanicIsAnError(t *testing.T) {
	c := &http.Client{Transport: &Transport{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") })}}
	if resp, err := c.Get("https://x/api"); err == nil || !strings.Contains(err.Error(), "panicked: boom") {
		if resp != nil {
			resp.Body.Close()
		}
		t.Fatalf("a panicking handler: %v", err)
	}
}
