package web_test

import (
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestSignInNamesDoNotGrowTheThrottle: refused sign-ins keep little in
// memory whatever name they type. A 16 KB name of U+FDFA (3 bytes, 33
// once NFKC-normalised) is refused unread; 255-byte ones, over many
// throttle windows, are dropped with their windows, not kept until the
// throttle's maps reach 100,000 keys.
func TestSignInNamesDoNotGrowTheThrottle(t *testing.T) {
	p, _ := carolPortal(t)
	signIn := func(i int, name string) {
		body := url.Values{"user": {name}, "password": {"x"}}.Encode()
		// raw UTF-8 in the form, as browsers may send it: 3 bytes per rune
		body = strings.ReplaceAll(body, url.QueryEscape("\ufdfa"), "\ufdfa")
		req, _ := http.NewRequest("POST", p.srv.URL+"/signin", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		resp, err := p.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("attempt %d (%d bytes): %s", i, len(body), resp.Status)
		}
	}
	for _, c := range []struct {
		runes, n int
		most     int64 // bytes kept per sign-in
	}{{5300, 200, 16 << 10}, {84, 1000, 1 << 10}} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range c.n {
			if i%20 == 0 {
				p.clock.add(6 * time.Minute) // a new window for 127.0.0.1
			}
			signIn(i, strings.Repeat("\ufdfa", c.runes)+string(rune('a'+i%26))+string(rune('a'+i/26%26))+string(rune('a'+i/676)))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
		t.Logf("%d refused sign-ins with %d-byte names left the heap %d KB larger: %d bytes each", c.n, 3*c.runes+3, grew>>10, grew/int64(c.n))
		if grew/int64(c.n) > c.most {
			t.Errorf("each refused sign-in with a %d-byte name keeps %d bytes", 3*c.runes+3, grew/int64(c.n))
		}
	}
}
