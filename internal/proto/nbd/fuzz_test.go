package nbd

import (
	"bytes"
	"testing"
)

// Every decoder must reject or accept any input without panicking, and
// what it accepts must encode back to the same bytes.

func FuzzInfoRequest(f *testing.F) {
	f.Add((&InfoRequest{Name: "golden", Infos: []InfoType{InfoBlockSize, InfoName}}).Append(nil))
	f.Add([]byte{0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r InfoRequest
		if r.Decode(b) != nil {
			return
		}
		if got := r.Append(nil); !bytes.Equal(got, b) {
			t.Fatalf("round trip: %x != %x", got, b)
		}
	})
}

func FuzzMetaContextRequest(f *testing.F) {
	f.Add((&MetaContextRequest{Name: "golden", Queries: []string{MetaContextBaseAllocation, "base:"}}).Append(nil))
	f.Add([]byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r MetaContextRequest
		if r.Decode(b) != nil {
			return
		}
		if got := r.Append(nil); !bytes.Equal(got, b) {
			t.Fatalf("round trip: %x != %x", got, b)
		}
	})
}

func FuzzRequest(f *testing.F) {
	f.Add((&Request{Cmd: CmdRead, Cookie: 1, Offset: 512, Length: 4096}).Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Request
		if r.Decode(b) != nil {
			return
		}
		if got := r.Append(nil); !bytes.Equal(got, b[:RequestLen]) {
			t.Fatalf("round trip: %x != %x", got, b[:RequestLen])
		}
	})
}

func FuzzOptionHeader(f *testing.F) {
	f.Add(AppendOption(nil, OptGo, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseOptionHeader(b)
		if err != nil {
			return
		}
		if got := AppendOption(nil, h.Option, nil)[:12]; !bytes.Equal(got, b[:12]) {
			t.Fatalf("round trip: %x != %x", got, b[:12])
		}
	})
}

// FuzzReplies covers the decoders a client uses on a server's answers.
func FuzzReplies(f *testing.F) {
	f.Add(AppendOptionReply(nil, OptGo, RepInfo, AppendInfoExport(nil, 1<<20, FlagHasFlags)))
	f.Add(AppendBlockStatusChunk(nil, ChunkFlagDone, 1, 1, []Extent{{Length: 512}}))
	f.Add(AppendErrorChunk(nil, 1, EIO, "x"))
	f.Add(AppendSimpleReply(nil, 0, 1))
	f.Fuzz(func(t *testing.T, b []byte) {
		if fl, err := ParseGreeting(b); err == nil && !bytes.Equal(AppendGreeting(nil, fl), b[:GreetingLen]) {
			t.Fatalf("greeting round trip")
		}
		_, _ = ParseOptionReplyHeader(b)
		_, _ = ParseInfo(b)
		_, _, _ = ParseServer(b)
		if r, err := ParseSimpleReply(b); err == nil && !bytes.Equal(AppendSimpleReply(nil, r.Error, r.Cookie), b[:SimpleReplyLen]) {
			t.Fatalf("simple reply round trip")
		}
		if h, err := ParseChunkHeader(b); err == nil && !bytes.Equal(AppendChunkHeader(nil, h), b[:StructuredHeaderLen]) {
			t.Fatalf("chunk header round trip")
		}
		// A block status payload is the context id and whole extents.
		if id, ext, err := ParseBlockStatus(b); err == nil {
			whole := AppendBlockStatusChunk(nil, 0, 0, id, ext)[StructuredHeaderLen:]
			if !bytes.Equal(whole, b) {
				t.Fatalf("block status round trip: %x != %x", whole, b)
			}
		}
		// An error chunk's payload is the errno, the message and nothing
		// the message length leaves out.
		if e, msg, err := ParseErrorChunk(b); err == nil {
			if len(msg) > len(b)-6 {
				t.Fatalf("error message of %d bytes from a %d-byte payload", len(msg), len(b))
			}
			if len(msg) <= MaxString {
				whole := AppendErrorChunk(nil, 0, e, msg)[StructuredHeaderLen:]
				if !bytes.Equal(whole, b[:6+len(msg)]) {
					t.Fatalf("error chunk round trip: %x != %x", whole, b[:6+len(msg)])
				}
			}
		}
	})
}
