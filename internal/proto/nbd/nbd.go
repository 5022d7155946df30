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
