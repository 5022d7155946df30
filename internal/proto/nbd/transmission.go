package nbd

import (
	"fmt"
)

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
