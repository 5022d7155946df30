package stream

import (
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// BenchmarkSendFileReply is the ceiling under the read path on this
// machine: 16 loopback connections, each sent 128 KiB replies (a header
// and sendfile from a cached 64 MiB file) as fast as a reader on the
// same machine takes them into a buffer.
func BenchmarkSendFileReply(b *testing.B) {
	const conns, chunk, size = 16, 128 << 10, 64 << 20
	path := filepath.Join(b.TempDir(), "base")
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	per := b.N/conns + 1
	b.SetBytes(chunk)
	var wg sync.WaitGroup
	b.ResetTimer()
	for i := 0; i < conns; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			defer s.Close()
			hdr := make([]byte, 16)
			for k := 0; k < per; k++ {
				off := int64(k*chunk) % size
				if err := sendFileReply(s.(*net.TCPConn), hdr, int(f.Fd()), off, chunk); err != nil {
					b.Error(err)
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			defer c.Close()
			buf := make([]byte, 256<<10)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
}
