// Package nbd encodes and decodes the Network Block Device protocol
// (fixed newstyle negotiation, simple and structured replies) as the
// NetworkBlockDevice/nbd proto.md specification defines it. It does no
// I/O: decoders take whole messages or fixed-size headers, encoders
// append to a byte slice. Every integer is big-endian.
package nbd

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Magic numbers.
const (
	Magic                uint64 = 0x4e42444d41474943 // "NBDMAGIC", first of the greeting
	OptsMagic            uint64 = 0x49484156454f5054 // "IHAVEOPT", greeting and every option
	OptReplyMagic        uint64 = 0x0003e889045565a9
	RequestMagic         uint32 = 0x25609513
	SimpleReplyMagic     uint32 = 0x67446698
	StructuredReplyMagic uint32 = 0x668e33ef
)

// Fixed sizes of headers.
const (
	GreetingLen          = 18 // NBDMAGIC, IHAVEOPT, handshake flags
	ClientFlagsLen       = 4
	OptionHeaderLen      = 16
	OptionReplyHeaderLen = 20
	RequestLen           = 28
	SimpleReplyLen       = 16
	StructuredHeaderLen  = 20
	// ExportNameZeroes is the padding after an NBD_OPT_EXPORT_NAME reply
	// unless both sides agreed to NO_ZEROES.
	ExportNameZeroes = 124
	// MaxString is the longest string (export name, message) the
	// specification allows.
	MaxString = 4096
)

// HandshakeFlags are the server's flags in the greeting.
type HandshakeFlags uint16

// Handshake flags.
const (
	FlagFixedNewstyle HandshakeFlags = 1 << 0
	FlagNoZeroes      HandshakeFlags = 1 << 1
)

// ClientFlags are the client's answer to the greeting.
type ClientFlags uint32

// Client flags.
const (
	FlagCFixedNewstyle ClientFlags = 1 << 0
	FlagCNoZeroes      ClientFlags = 1 << 1
)

// TransmissionFlags describe an export.
type TransmissionFlags uint16

// Transmission flags.
const (
	FlagHasFlags         TransmissionFlags = 1 << 0
	FlagReadOnly         TransmissionFlags = 1 << 1
	FlagSendFlush        TransmissionFlags = 1 << 2
	FlagSendFUA          TransmissionFlags = 1 << 3
	FlagRotational       TransmissionFlags = 1 << 4
	FlagSendTrim         TransmissionFlags = 1 << 5
	FlagSendWriteZeroes  TransmissionFlags = 1 << 6
	FlagSendDF           TransmissionFlags = 1 << 7
	FlagCanMultiConn     TransmissionFlags = 1 << 8
	FlagSendResize       TransmissionFlags = 1 << 9
	FlagSendCache        TransmissionFlags = 1 << 10
	FlagSendFastZero     TransmissionFlags = 1 << 11
	FlagBlockStatPayload TransmissionFlags = 1 << 12
)

// Option is an option the client sends during negotiation.
type Option uint32

// Options.
const (
	OptExportName      Option = 1
	OptAbort           Option = 2
	OptList            Option = 3
	OptPeekExport      Option = 4 // withdrawn
	OptStartTLS        Option = 5
	OptInfo            Option = 6
	OptGo              Option = 7
	OptStructuredReply Option = 8
	OptListMetaContext Option = 9
	OptSetMetaContext  Option = 10
	OptExtendedHeaders Option = 11
)

var optionNames = map[Option]string{
	OptExportName: "NBD_OPT_EXPORT_NAME", OptAbort: "NBD_OPT_ABORT", OptList: "NBD_OPT_LIST",
	OptPeekExport: "NBD_OPT_PEEK_EXPORT", OptStartTLS: "NBD_OPT_STARTTLS", OptInfo: "NBD_OPT_INFO",
	OptGo: "NBD_OPT_GO", OptStructuredReply: "NBD_OPT_STRUCTURED_REPLY",
	OptListMetaContext: "NBD_OPT_LIST_META_CONTEXT", OptSetMetaContext: "NBD_OPT_SET_META_CONTEXT",
	OptExtendedHeaders: "NBD_OPT_EXTENDED_HEADERS",
}

// String names o as the specification does.
func (o Option) String() string {
	if s, ok := optionNames[o]; ok {
		return s
	}
	return fmt.Sprintf("NBD_OPT_%d", uint32(o))
}

// ReplyType is the type of an option reply. Error types have bit 31 set.
type ReplyType uint32

// Option reply types.
const (
	RepAck         ReplyType = 1
	RepServer      ReplyType = 2
	RepInfo        ReplyType = 3
	RepMetaContext ReplyType = 4

	RepErrUnsup         ReplyType = 1<<31 + 1
	RepErrPolicy        ReplyType = 1<<31 + 2
	RepErrInvalid       ReplyType = 1<<31 + 3
	RepErrPlatform      ReplyType = 1<<31 + 4
	RepErrTLSReqd       ReplyType = 1<<31 + 5
	RepErrUnknown       ReplyType = 1<<31 + 6
	RepErrShutdown      ReplyType = 1<<31 + 7
	RepErrBlockSizeReqd ReplyType = 1<<31 + 8
	RepErrTooBig        ReplyType = 1<<31 + 9
	RepErrExtHeaderReqd ReplyType = 1<<31 + 10
)

// IsError reports whether t is an error reply.
func (t ReplyType) IsError() bool { return t&(1<<31) != 0 }

// InfoType names one item of NBD_REP_INFO.
type InfoType uint16

// Info types.
const (
	InfoExport      InfoType = 0
	InfoName        InfoType = 1
	InfoDescription InfoType = 2
	InfoBlockSize   InfoType = 3
)

// Cmd is a transmission-phase command.
type Cmd uint16

// Commands.
const (
	CmdRead        Cmd = 0
	CmdWrite       Cmd = 1
	CmdDisc        Cmd = 2
	CmdFlush       Cmd = 3
	CmdTrim        Cmd = 4
	CmdCache       Cmd = 5
	CmdWriteZeroes Cmd = 6
	CmdBlockStatus Cmd = 7
	CmdResize      Cmd = 8
)

var cmdNames = map[Cmd]string{
	CmdRead: "NBD_CMD_READ", CmdWrite: "NBD_CMD_WRITE", CmdDisc: "NBD_CMD_DISC", CmdFlush: "NBD_CMD_FLUSH",
	CmdTrim: "NBD_CMD_TRIM", CmdCache: "NBD_CMD_CACHE", CmdWriteZeroes: "NBD_CMD_WRITE_ZEROES",
	CmdBlockStatus: "NBD_CMD_BLOCK_STATUS", CmdResize: "NBD_CMD_RESIZE",
}

// String names c as the specification does.
func (c Cmd) String() string {
	if s, ok := cmdNames[c]; ok {
		return s
	}
	return fmt.Sprintf("NBD_CMD_%d", uint16(c))
}

// CmdFlags modify a command.
type CmdFlags uint16

// Command flags.
const (
	CmdFlagFUA        CmdFlags = 1 << 0
	CmdFlagNoHole     CmdFlags = 1 << 1
	CmdFlagDF         CmdFlags = 1 << 2
	CmdFlagReqOne     CmdFlags = 1 << 3
	CmdFlagFastZero   CmdFlags = 1 << 4
	CmdFlagPayloadLen CmdFlags = 1 << 5
)

// Errno is an error value in a reply.
type Errno uint32

// Error values.
const (
	EPERM     Errno = 1
	EIO       Errno = 5
	ENOMEM    Errno = 12
	EINVAL    Errno = 22
	ENOSPC    Errno = 28
	EOVERFLOW Errno = 75
	ENOTSUP   Errno = 95
	ESHUTDOWN Errno = 108
)

var errnoNames = map[Errno]string{EPERM: "EPERM", EIO: "EIO", ENOMEM: "ENOMEM", EINVAL: "EINVAL",
	ENOSPC: "ENOSPC", EOVERFLOW: "EOVERFLOW", ENOTSUP: "ENOTSUP", ESHUTDOWN: "ESHUTDOWN"}

// String names e as errno.h does.
func (e Errno) String() string {
	if s, ok := errnoNames[e]; ok {
		return s
	}
	return fmt.Sprintf("errno %d", uint32(e))
}

// ChunkType is the type of a structured reply chunk. Error types have bit 15 set.
type ChunkType uint16

// Structured reply chunk types.
const (
	ChunkNone           ChunkType = 0
	ChunkOffsetData     ChunkType = 1
	ChunkOffsetHole     ChunkType = 2
	ChunkBlockStatus    ChunkType = 5
	ChunkBlockStatusExt ChunkType = 6
	ChunkError          ChunkType = 1<<15 + 1
	ChunkErrorOffset    ChunkType = 1<<15 + 2
)

// ChunkFlagDone marks the last chunk of a reply.
const ChunkFlagDone uint16 = 1 << 0

// Block status flags of the base:allocation meta context.
const (
	StateHole uint32 = 1 << 0
	StateZero uint32 = 1 << 1
)

// MetaContextBaseAllocation is the one meta context every server should know.
const MetaContextBaseAllocation = "base:allocation"

// ErrShort means a buffer ended before the structure it should hold.
var ErrShort = errors.New("nbd: message too short")

// ErrMagic means a magic number was wrong.
var ErrMagic = errors.New("nbd: bad magic")

var be = binary.BigEndian

// AppendGreeting appends the server's first 18 bytes.
func AppendGreeting(b []byte, f HandshakeFlags) []byte {
	b = be.AppendUint64(b, Magic)
	b = be.AppendUint64(b, OptsMagic)
	return be.AppendUint16(b, uint16(f))
}

// ParseGreeting decodes the server's greeting (a client's view).
func ParseGreeting(b []byte) (HandshakeFlags, error) {
	if len(b) < GreetingLen {
		return 0, ErrShort
	}
	if be.Uint64(b) != Magic || be.Uint64(b[8:]) != OptsMagic {
		return 0, fmt.Errorf("%w in greeting (not a fixed newstyle NBD server)", ErrMagic)
	}
	return HandshakeFlags(be.Uint16(b[16:])), nil
}

// ParseClientFlags decodes the client's 4-byte answer to the greeting.
func ParseClientFlags(b []byte) (ClientFlags, error) {
	if len(b) < ClientFlagsLen {
		return 0, ErrShort
	}
	return ClientFlags(be.Uint32(b)), nil
}

// OptionHeader starts every option the client sends; Length bytes of
// data follow it.
type OptionHeader struct {
	Option Option
	Length uint32
}

// ParseOptionHeader decodes the 16-byte header of an option.
func ParseOptionHeader(b []byte) (OptionHeader, error) {
	if len(b) < OptionHeaderLen {
		return OptionHeader{}, ErrShort
	}
	if be.Uint64(b) != OptsMagic {
		return OptionHeader{}, fmt.Errorf("%w: option does not start with IHAVEOPT", ErrMagic)
	}
	return OptionHeader{Option: Option(be.Uint32(b[8:])), Length: be.Uint32(b[12:])}, nil
}

// AppendOption appends an option with its data (a client's side).
func AppendOption(b []byte, o Option, data []byte) []byte {
	b = be.AppendUint64(b, OptsMagic)
	b = be.AppendUint32(b, uint32(o))
	b = be.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// OptionReplyHeader starts every option reply; Length bytes follow it.
type OptionReplyHeader struct {
	Option Option
	Type   ReplyType
	Length uint32
}

// AppendOptionReply appends a reply to option o with its data.
func AppendOptionReply(b []byte, o Option, t ReplyType, data []byte) []byte {
	b = be.AppendUint64(b, OptReplyMagic)
	b = be.AppendUint32(b, uint32(o))
	b = be.AppendUint32(b, uint32(t))
	b = be.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}

// ParseOptionReplyHeader decodes the 20-byte header of an option reply.
func ParseOptionReplyHeader(b []byte) (OptionReplyHeader, error) {
	if len(b) < OptionReplyHeaderLen {
		return OptionReplyHeader{}, ErrShort
	}
	if be.Uint64(b) != OptReplyMagic {
		return OptionReplyHeader{}, fmt.Errorf("%w in option reply", ErrMagic)
	}
	return OptionReplyHeader{Option: Option(be.Uint32(b[8:])), Type: ReplyType(be.Uint32(b[12:])), Length: be.Uint32(b[16:])}, nil
}

// AppendExportNameReply appends the answer to NBD_OPT_EXPORT_NAME: size,
// flags, and the 124 zero bytes unless NO_ZEROES was agreed.
func AppendExportNameReply(b []byte, size uint64, f TransmissionFlags, noZeroes bool) []byte {
	b = be.AppendUint64(b, size)
	b = be.AppendUint16(b, uint16(f))
	if !noZeroes {
		b = append(b, make([]byte, ExportNameZeroes)...)
	}
	return b
}

// AppendServer appends the data of an NBD_REP_SERVER reply (one export in a list).
func AppendServer(b []byte, name, description string) []byte {
	b = be.AppendUint32(b, uint32(len(name)))
	b = append(b, name...)
	return append(b, description...)
}

// ParseServer decodes the data of an NBD_REP_SERVER reply.
func ParseServer(b []byte) (name, description string, err error) {
	if len(b) < 4 {
		return "", "", ErrShort
	}
	n := be.Uint32(b)
	if uint64(n) > uint64(len(b)-4) {
		return "", "", fmt.Errorf("nbd: export name of %d bytes in a %d-byte reply", n, len(b))
	}
	return string(b[4 : 4+n]), string(b[4+n:]), nil
}

// InfoRequest is the data of NBD_OPT_INFO and NBD_OPT_GO.
type InfoRequest struct {
	Name  string
	Infos []InfoType
}

// Decode parses the option data.
func (r *InfoRequest) Decode(b []byte) error {
	name, rest, err := parseString(b, "export name")
	if err != nil {
		return err
	}
	if len(rest) < 2 {
		return ErrShort
	}
	n := int(be.Uint16(rest))
	rest = rest[2:]
	if len(rest) != 2*n {
		return fmt.Errorf("nbd: %d information requests need %d bytes, have %d", n, 2*n, len(rest))
	}
	r.Name, r.Infos = name, make([]InfoType, n)
	for i := range r.Infos {
		r.Infos[i] = InfoType(be.Uint16(rest[2*i:]))
	}
	return nil
}

// Append encodes the option data.
func (r *InfoRequest) Append(b []byte) []byte {
	b = be.AppendUint32(b, uint32(len(r.Name)))
	b = append(b, r.Name...)
	b = be.AppendUint16(b, uint16(len(r.Infos)))
	for _, t := range r.Infos {
		b = be.AppendUint16(b, uint16(t))
	}
	return b
}

// AppendInfoExport appends the data of NBD_REP_INFO with NBD_INFO_EXPORT.
func AppendInfoExport(b []byte, size uint64, f TransmissionFlags) []byte {
	b = be.AppendUint16(b, uint16(InfoExport))
	b = be.AppendUint64(b, size)
	return be.AppendUint16(b, uint16(f))
}

// AppendInfoString appends NBD_INFO_NAME or NBD_INFO_DESCRIPTION data.
func AppendInfoString(b []byte, t InfoType, s string) []byte {
	b = be.AppendUint16(b, uint16(t))
	return append(b, s...)
}

// AppendInfoBlockSize appends NBD_INFO_BLOCK_SIZE data.
func AppendInfoBlockSize(b []byte, minimum, preferred, maximum uint32) []byte {
	b = be.AppendUint16(b, uint16(InfoBlockSize))
	b = be.AppendUint32(b, minimum)
	b = be.AppendUint32(b, preferred)
	return be.AppendUint32(b, maximum)
}

// Info is a decoded NBD_REP_INFO payload (a client's view).
type Info struct {
	Type      InfoType
	Size      uint64
	Flags     TransmissionFlags
	Text      string // name or description
	Min, Pref uint32
	Max       uint32
}

// ParseInfo decodes the data of an NBD_REP_INFO reply.
func ParseInfo(b []byte) (Info, error) {
	if len(b) < 2 {
		return Info{}, ErrShort
	}
	in := Info{Type: InfoType(be.Uint16(b))}
	b = b[2:]
	switch in.Type {
	case InfoExport:
		if len(b) != 10 {
			return in, fmt.Errorf("nbd: NBD_INFO_EXPORT of %d bytes, want 12", len(b)+2)
		}
		in.Size, in.Flags = be.Uint64(b), TransmissionFlags(be.Uint16(b[8:]))
	case InfoName, InfoDescription:
		if len(b) > MaxString {
			return in, fmt.Errorf("nbd: info string of %d bytes over %d", len(b), MaxString)
		}
		in.Text = string(b)
	case InfoBlockSize:
		if len(b) != 12 {
			return in, fmt.Errorf("nbd: NBD_INFO_BLOCK_SIZE of %d bytes, want 14", len(b)+2)
		}
		in.Min, in.Pref, in.Max = be.Uint32(b), be.Uint32(b[4:]), be.Uint32(b[8:])
	}
	return in, nil
}

// MetaContextRequest is the data of NBD_OPT_LIST_META_CONTEXT and
// NBD_OPT_SET_META_CONTEXT.
type MetaContextRequest struct {
	Name    string
	Queries []string
}

// Decode parses the option data.
func (r *MetaContextRequest) Decode(b []byte) error {
	name, rest, err := parseString(b, "export name")
	if err != nil {
		return err
	}
	if len(rest) < 4 {
		return ErrShort
	}
	n := be.Uint32(rest)
	rest = rest[4:]
	// Each query takes at least its 4-byte length.
	if uint64(n)*4 > uint64(len(rest)) {
		return fmt.Errorf("nbd: %d meta context queries in %d bytes", n, len(rest))
	}
	r.Name, r.Queries = name, make([]string, 0, n)
	for i := uint32(0); i < n; i++ {
		var q string
		if q, rest, err = parseString(rest, "meta context query"); err != nil {
			return err
		}
		r.Queries = append(r.Queries, q)
	}
	if len(rest) != 0 {
		return fmt.Errorf("nbd: %d bytes after the meta context queries", len(rest))
	}
	return nil
}

// Append encodes the option data.
func (r *MetaContextRequest) Append(b []byte) []byte {
	b = be.AppendUint32(b, uint32(len(r.Name)))
	b = append(b, r.Name...)
	b = be.AppendUint32(b, uint32(len(r.Queries)))
	for _, q := range r.Queries {
		b = be.AppendUint32(b, uint32(len(q)))
		b = append(b, q...)
	}
	return b
}

// AppendMetaContext appends the data of an NBD_REP_META_CONTEXT reply.
func AppendMetaContext(b []byte, id uint32, name string) []byte {
	b = be.AppendUint32(b, id)
	return append(b, name...)
}

// parseString reads a 32-bit length and that many bytes of string.
func parseString(b []byte, what string) (string, []byte, error) {
	if len(b) < 4 {
		return "", nil, ErrShort
	}
	n := be.Uint32(b)
	if n > MaxString {
		return "", nil, fmt.Errorf("nbd: %s of %d bytes over %d", what, n, MaxString)
	}
	if int(n) > len(b)-4 {
		return "", nil, fmt.Errorf("nbd: %s of %d bytes in %d", what, n, len(b)-4)
	}
	return string(b[4 : 4+n]), b[4+n:], nil
}

// Request is a transmission-phase request header; a WRITE's Length bytes
// of data follow it.
type Request struct {
	Flags  CmdFlags
	Cmd    Cmd
	Cookie uint64
	Offset uint64
	Length uint32
}

// Decode parses the 28-byte request header.
func (r *Request) Decode(b []byte) error {
	if len(b) < RequestLen {
		return ErrShort
	}
	if be.Uint32(b) != RequestMagic {
		return fmt.Errorf("%w in request: %#08x", ErrMagic, be.Uint32(b))
	}
	r.Flags = CmdFlags(be.Uint16(b[4:]))
	r.Cmd = Cmd(be.Uint16(b[6:]))
	r.Cookie = be.Uint64(b[8:])
	r.Offset = be.Uint64(b[16:])
	r.Length = be.Uint32(b[24:])
	return nil
}

// Append encodes the request header.
func (r *Request) Append(b []byte) []byte {
	b = be.AppendUint32(b, RequestMagic)
	b = be.AppendUint16(b, uint16(r.Flags))
	b = be.AppendUint16(b, uint16(r.Cmd))
	b = be.AppendUint64(b, r.Cookie)
	b = be.AppendUint64(b, r.Offset)
	return be.AppendUint32(b, r.Length)
}

// AppendSimpleReply appends a simple reply header; a successful READ's
// data follows it.
func AppendSimpleReply(b []byte, err Errno, cookie uint64) []byte {
	b = be.AppendUint32(b, SimpleReplyMagic)
	b = be.AppendUint32(b, uint32(err))
	return be.AppendUint64(b, cookie)
}

// SimpleReply is a decoded simple reply header.
type SimpleReply struct {
	Error  Errno
	Cookie uint64
}

// ParseSimpleReply decodes a 16-byte simple reply header.
func ParseSimpleReply(b []byte) (SimpleReply, error) {
	if len(b) < SimpleReplyLen {
		return SimpleReply{}, ErrShort
	}
	if be.Uint32(b) != SimpleReplyMagic {
		return SimpleReply{}, fmt.Errorf("%w in simple reply", ErrMagic)
	}
	return SimpleReply{Error: Errno(be.Uint32(b[4:])), Cookie: be.Uint64(b[8:])}, nil
}

// ChunkHeader starts every structured reply chunk; Length bytes follow.
type ChunkHeader struct {
	Flags  uint16
	Type   ChunkType
	Cookie uint64
	Length uint32
}

// AppendChunkHeader appends a structured reply chunk header.
func AppendChunkHeader(b []byte, h ChunkHeader) []byte {
	b = be.AppendUint32(b, StructuredReplyMagic)
	b = be.AppendUint16(b, h.Flags)
	b = be.AppendUint16(b, uint16(h.Type))
	b = be.AppendUint64(b, h.Cookie)
	return be.AppendUint32(b, h.Length)
}

// ParseChunkHeader decodes a 20-byte structured reply chunk header.
func ParseChunkHeader(b []byte) (ChunkHeader, error) {
	if len(b) < StructuredHeaderLen {
		return ChunkHeader{}, ErrShort
	}
	if be.Uint32(b) != StructuredReplyMagic {
		return ChunkHeader{}, fmt.Errorf("%w in structured reply", ErrMagic)
	}
	return ChunkHeader{Flags: be.Uint16(b[4:]), Type: ChunkType(be.Uint16(b[6:])), Cookie: be.Uint64(b[8:]), Length: be.Uint32(b[16:])}, nil
}

// AppendOffsetDataChunk appends the header of an NBD_REPLY_TYPE_OFFSET_DATA
// chunk carrying n bytes at offset, and the offset; the n bytes follow.
func AppendOffsetDataChunk(b []byte, flags uint16, cookie, offset uint64, n int) []byte {
	b = AppendChunkHeader(b, ChunkHeader{Flags: flags, Type: ChunkOffsetData, Cookie: cookie, Length: uint32(8 + n)})
	return be.AppendUint64(b, offset)
}

// AppendOffsetHoleChunk appends a whole NBD_REPLY_TYPE_OFFSET_HOLE chunk.
func AppendOffsetHoleChunk(b []byte, flags uint16, cookie, offset uint64, size uint32) []byte {
	b = AppendChunkHeader(b, ChunkHeader{Flags: flags, Type: ChunkOffsetHole, Cookie: cookie, Length: 12})
	b = be.AppendUint64(b, offset)
	return be.AppendUint32(b, size)
}

// Extent is one block status descriptor.
type Extent struct {
	Length uint32
	Flags  uint32
}

// AppendBlockStatusChunk appends a whole NBD_REPLY_TYPE_BLOCK_STATUS chunk.
func AppendBlockStatusChunk(b []byte, flags uint16, cookie uint64, contextID uint32, ext []Extent) []byte {
	b = AppendChunkHeader(b, ChunkHeader{Flags: flags, Type: ChunkBlockStatus, Cookie: cookie, Length: uint32(4 + 8*len(ext))})
	b = be.AppendUint32(b, contextID)
	for _, e := range ext {
		b = be.AppendUint32(b, e.Length)
		b = be.AppendUint32(b, e.Flags)
	}
	return b
}

// ParseBlockStatus decodes the payload of a block status chunk.
func ParseBlockStatus(b []byte) (contextID uint32, ext []Extent, err error) {
	if len(b) < 4 || (len(b)-4)%8 != 0 {
		return 0, nil, fmt.Errorf("nbd: block status payload of %d bytes is not 4 + 8n", len(b))
	}
	contextID = be.Uint32(b)
	for p := b[4:]; len(p) > 0; p = p[8:] {
		ext = append(ext, Extent{Length: be.Uint32(p), Flags: be.Uint32(p[4:])})
	}
	return contextID, ext, nil
}

// AppendErrorChunk appends a whole NBD_REPLY_TYPE_ERROR chunk with the
// DONE flag, the errno and a message for humans.
func AppendErrorChunk(b []byte, cookie uint64, e Errno, msg string) []byte {
	if len(msg) > MaxString {
		msg = msg[:MaxString]
	}
	b = AppendChunkHeader(b, ChunkHeader{Flags: ChunkFlagDone, Type: ChunkError, Cookie: cookie, Length: uint32(6 + len(msg))})
	b = be.AppendUint32(b, uint32(e))
	b = be.AppendUint16(b, uint16(len(msg)))
	return append(b, msg...)
}

// ParseErrorChunk decodes the payload of an error chunk.
func ParseErrorChunk(b []byte) (Errno, string, error) {
	if len(b) < 6 {
		return 0, "", ErrShort
	}
	n := int(be.Uint16(b[4:]))
	if n > len(b)-6 {
		return 0, "", fmt.Errorf("nbd: error message of %d bytes in %d", n, len(b)-6)
	}
	return Errno(be.Uint32(b)), string(b[6 : 6+n]), nil
}
