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
		_, _ = ParseGreeting(b)
		_, _ = ParseOptionReplyHeader(b)
		_, _ = ParseInfo(b)
		_, _, _ = ParseServer(b)
		_, _ = ParseSimpleReply(b)
		if h, err := ParseChunkHeader(b); err == nil && !bytes.Equal(AppendChunkHeader(nil, h), b[:StructuredHeaderLen]) {
			t.Fatalf("chunk header round trip")
		}
		_, _, _ = ParseBlockStatus(b)
		_, _, _ = ParseErrorChunk(b)
	})
}
