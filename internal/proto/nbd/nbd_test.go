package nbd

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func eqHex(t *testing.T, what string, got []byte, want string) {
	t.Helper()
	w := strings.Join(strings.Fields(want), "")
	if hex.EncodeToString(got) != w {
		t.Errorf("%s:\n got %x\nwant %s", what, got, w)
	}
}

func TestGreeting(t *testing.T) {
	const v = "4e42444d41474943 49484156454f5054 0003"
	eqHex(t, "greeting", AppendGreeting(nil, FlagFixedNewstyle|FlagNoZeroes), v)
	f, err := ParseGreeting(unhex(t, v))
	if err != nil || f != FlagFixedNewstyle|FlagNoZeroes {
		t.Fatalf("ParseGreeting: %v %v", f, err)
	}
	// An oldstyle server sends the cliserv magic instead of IHAVEOPT.
	if _, err := ParseGreeting(unhex(t, "4e42444d41474943 0000420281861253 0000")); !errors.Is(err, ErrMagic) {
		t.Fatalf("oldstyle greeting: %v", err)
	}
	cf, err := ParseClientFlags(unhex(t, "00000003"))
	if err != nil || cf != FlagCFixedNewstyle|FlagCNoZeroes {
		t.Fatalf("client flags: %v %v", cf, err)
	}
}

func TestOption(t *testing.T) {
	// NBD_OPT_GO for export "golden" asking for NBD_INFO_BLOCK_SIZE.
	req := InfoRequest{Name: "golden", Infos: []InfoType{InfoBlockSize}}
	const v = "49484156454f5054 00000007 0000000e 00000006 676f6c64656e 0001 0003"
	b := AppendOption(nil, OptGo, req.Append(nil))
	eqHex(t, "NBD_OPT_GO", b, v)
	h, err := ParseOptionHeader(b)
	if err != nil || h.Option != OptGo || h.Length != 14 {
		t.Fatalf("header: %+v %v", h, err)
	}
	var got InfoRequest
	if err := got.Decode(b[OptionHeaderLen:]); err != nil || got.Name != "golden" || len(got.Infos) != 1 || got.Infos[0] != InfoBlockSize {
		t.Fatalf("InfoRequest: %+v %v", got, err)
	}
	if h.Option.String() != "NBD_OPT_GO" || Option(99).String() != "NBD_OPT_99" {
		t.Errorf("names: %s %s", h.Option, Option(99))
	}
	// A count of requests that does not match the bytes that follow.
	if err := got.Decode(unhex(t, "00000000 0002 0003")); err == nil {
		t.Error("short info list accepted")
	}
	if _, err := ParseOptionHeader(unhex(t, "49484156454f5055 00000007 00000000")); !errors.Is(err, ErrMagic) {
		t.Errorf("bad option magic: %v", err)
	}
}

func TestOptionReplies(t *testing.T) {
	eqHex(t, "ack", AppendOptionReply(nil, OptStructuredReply, RepAck, nil),
		"0003e889045565a9 00000008 00000001 00000000")
	eqHex(t, "info export", AppendOptionReply(nil, OptGo, RepInfo, AppendInfoExport(nil, 1<<30, FlagHasFlags|FlagReadOnly)),
		"0003e889045565a9 00000007 00000003 0000000c 0000 0000000040000000 0003")
	eqHex(t, "block size", AppendInfoBlockSize(nil, 1, 4096, 32<<20), "0003 00000001 00001000 02000000")
	eqHex(t, "err unknown", AppendOptionReply(nil, OptGo, RepErrUnknown, []byte("no")),
		"0003e889045565a9 00000007 80000006 00000002 6e6f")
	h, err := ParseOptionReplyHeader(unhex(t, "0003e889045565a9 00000007 80000006 00000002"))
	if err != nil || h.Type != RepErrUnknown || !h.Type.IsError() || h.Length != 2 {
		t.Fatalf("reply header: %+v %v", h, err)
	}
	in, err := ParseInfo(unhex(t, "0000 0000000040000000 0003"))
	if err != nil || in.Size != 1<<30 || in.Flags != FlagHasFlags|FlagReadOnly {
		t.Fatalf("ParseInfo: %+v %v", in, err)
	}
	in, err = ParseInfo(unhex(t, "0003 00000001 00001000 02000000"))
	if err != nil || in.Min != 1 || in.Pref != 4096 || in.Max != 32<<20 {
		t.Fatalf("ParseInfo block size: %+v %v", in, err)
	}
	srv := AppendServer(nil, "golden", "Windows 10")
	eqHex(t, "server", srv, "00000006 676f6c64656e 57696e646f7773203130")
	name, desc, err := ParseServer(srv)
	if err != nil || name != "golden" || desc != "Windows 10" {
		t.Fatalf("ParseServer: %q %q %v", name, desc, err)
	}
	eqHex(t, "export name reply", AppendExportNameReply(nil, 512, FlagHasFlags, true), "0000000000000200 0001")
	if n := len(AppendExportNameReply(nil, 512, FlagHasFlags, false)); n != 10+ExportNameZeroes {
		t.Errorf("export name reply with zeroes is %d bytes", n)
	}
}

func TestMetaContext(t *testing.T) {
	r := MetaContextRequest{Name: "a", Queries: []string{MetaContextBaseAllocation}}
	const v = "00000001 61 00000001 0000000f 626173653a616c6c6f636174696f6e"
	eqHex(t, "meta context request", r.Append(nil), v)
	var got MetaContextRequest
	if err := got.Decode(unhex(t, v)); err != nil || got.Name != "a" || len(got.Queries) != 1 || got.Queries[0] != MetaContextBaseAllocation {
		t.Fatalf("Decode: %+v %v", got, err)
	}
	// A count far larger than the data must fail before allocating.
	if err := got.Decode(unhex(t, "00000000 ffffffff")); err == nil {
		t.Error("huge query count accepted")
	}
	if err := got.Decode(unhex(t, v+"00")); err == nil {
		t.Error("trailing byte accepted")
	}
	eqHex(t, "meta context reply", AppendMetaContext(nil, 1, MetaContextBaseAllocation), "00000001 626173653a616c6c6f636174696f6e")
}

func TestRequest(t *testing.T) {
	r := Request{Flags: CmdFlagFUA, Cmd: CmdWrite, Cookie: 0x0102030405060708, Offset: 4096, Length: 512}
	const v = "25609513 0001 0001 0102030405060708 0000000000001000 00000200"
	eqHex(t, "request", r.Append(nil), v)
	var got Request
	if err := got.Decode(unhex(t, v)); err != nil || got != r {
		t.Fatalf("Decode: %+v %v", got, err)
	}
	if err := got.Decode(unhex(t, "25609514 0001 0001 0102030405060708 0000000000001000 00000200")); !errors.Is(err, ErrMagic) {
		t.Errorf("bad magic: %v", err)
	}
	if err := got.Decode(make([]byte, RequestLen-1)); !errors.Is(err, ErrShort) {
		t.Errorf("short: %v", err)
	}
	if CmdBlockStatus.String() != "NBD_CMD_BLOCK_STATUS" || EINVAL.String() != "EINVAL" {
		t.Errorf("names")
	}
}

func TestReplies(t *testing.T) {
	eqHex(t, "simple", AppendSimpleReply(nil, EPERM, 7), "67446698 00000001 0000000000000007")
	sr, err := ParseSimpleReply(unhex(t, "67446698 00000001 0000000000000007"))
	if err != nil || sr.Error != EPERM || sr.Cookie != 7 {
		t.Fatalf("ParseSimpleReply: %+v %v", sr, err)
	}
	eqHex(t, "offset data", AppendOffsetDataChunk(nil, ChunkFlagDone, 7, 4096, 3),
		"668e33ef 0001 0001 0000000000000007 0000000b 0000000000001000")
	eqHex(t, "offset hole", AppendOffsetHoleChunk(nil, 0, 7, 0, 512),
		"668e33ef 0000 0002 0000000000000007 0000000c 0000000000000000 00000200")
	bs := AppendBlockStatusChunk(nil, ChunkFlagDone, 9, 1, []Extent{{Length: 65536, Flags: 0}, {Length: 4096, Flags: StateHole | StateZero}})
	eqHex(t, "block status", bs, "668e33ef 0001 0005 0000000000000009 00000014 00000001 00010000 00000000 00001000 00000003")
	h, err := ParseChunkHeader(bs)
	if err != nil || h.Type != ChunkBlockStatus || h.Length != 20 || h.Flags != ChunkFlagDone {
		t.Fatalf("ParseChunkHeader: %+v %v", h, err)
	}
	id, ext, err := ParseBlockStatus(bs[StructuredHeaderLen:])
	if err != nil || id != 1 || len(ext) != 2 || ext[1].Flags != 3 {
		t.Fatalf("ParseBlockStatus: %d %+v %v", id, ext, err)
	}
	ec := AppendErrorChunk(nil, 7, ENOSPC, "full")
	eqHex(t, "error chunk", ec, "668e33ef 0001 8001 0000000000000007 0000000a 0000001c 0004 66756c6c")
	e, msg, err := ParseErrorChunk(ec[StructuredHeaderLen:])
	if err != nil || e != ENOSPC || msg != "full" {
		t.Fatalf("ParseErrorChunk: %v %q %v", e, msg, err)
	}
	if _, _, err := ParseErrorChunk(unhex(t, "0000001c 0010 66")); err == nil {
		t.Error("error message longer than its chunk accepted")
	}
	if !bytes.Equal(AppendChunkHeader(nil, h), bs[:StructuredHeaderLen]) {
		t.Error("chunk header round trip")
	}
}
