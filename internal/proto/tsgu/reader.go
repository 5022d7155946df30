package tsgu

import (
	"encoding/binary"
	"fmt"
	"unicode/utf16"
)

// reader walks a packet body with bounds checks; the first failure sticks
// so decoders can read every field and check err once.
type reader struct {
	t   PacketType
	b   []byte
	off int
	err *DecodeError
}

func (r *reader) fail(reason string) {
	if r.err == nil {
		r.err = &DecodeError{Type: r.t, Offset: HeaderLen + r.off, Reason: reason}
	}
}

func (r *reader) need(n int, what string) bool {
	if r.err != nil {
		return false
	}
	if n < 0 || len(r.b)-r.off < n {
		r.fail(fmt.Sprintf("%s needs %d bytes, %d remain", what, n, len(r.b)-r.off))
		return false
	}
	return true
}

func (r *reader) u8(what string) uint8 {
	if !r.need(1, what) {
		return 0
	}
	v := r.b[r.off]
	r.off++
	return v
}

func (r *reader) u16(what string) uint16 {
	if !r.need(2, what) {
		return 0
	}
	v := binary.LittleEndian.Uint16(r.b[r.off:])
	r.off += 2
	return v
}

func (r *reader) u32(what string) uint32 {
	if !r.need(4, what) {
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v
}

func (r *reader) u64(what string) uint64 {
	if !r.need(8, what) {
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b[r.off:])
	r.off += 8
	return v
}

func (r *reader) bytes(n int, what string) []byte {
	if !r.need(n, what) {
		return nil
	}
	v := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return v
}

// blob reads an HTTP_BYTE_BLOB (16-bit length, then bytes).
func (r *reader) blob(what string) []byte {
	n := r.u16(what + " length")
	return r.bytes(int(n), what)
}

// fields reads a fieldsPresent word and the reserved word after it,
// failing on a bit outside known.
func (r *reader) fields(known uint16) uint16 {
	f := r.u16("fieldsPresent")
	r.u16("reserved")
	r.onlyKnown(f, known)
	return f
}

// onlyKnown fails on a bit of fieldsPresent f outside known.
func (r *reader) onlyKnown(f, known uint16) {
	if f&^known != 0 {
		r.fail(fmt.Sprintf("unknown fieldsPresent bits 0x%x", f))
	}
}

// optBlob reads a blob that fieldsPresent says is there or not: nil when
// it is not, empty but not nil when it is there with no bytes, so that
// Append writes it again.
func (r *reader) optBlob(present bool, what string) []byte {
	if !present {
		return nil
	}
	b := r.blob(what)
	if b == nil && r.err == nil {
		b = []byte{}
	}
	return b
}

// utf16 decodes n bytes of UTF-16LE, dropping one trailing NUL (clients
// include it, the spec leaves it open).
func (r *reader) utf16(n int, what string) string {
	if n%2 != 0 {
		r.fail(fmt.Sprintf("%s length %d is odd, not UTF-16", what, n))
		return ""
	}
	raw := r.bytes(n, what)
	if raw == nil {
		return ""
	}
	return decodeUTF16(raw)
}

// unicodeString reads an HTTP_UNICODE_STRING (16-bit byte count, then UTF-16LE).
func (r *reader) unicodeString(what string) string {
	n := r.u16(what + " length")
	return r.utf16(int(n), what)
}

// done fails if bytes are left over: a packet with trailing junk is malformed.
func (r *reader) done() error {
	if r.err == nil && r.off != len(r.b) {
		r.fail(fmt.Sprintf("%d unexpected trailing bytes", len(r.b)-r.off))
	}
	if r.err != nil {
		return r.err
	}
	return nil
}

func decodeUTF16(raw []byte) string {
	u := make([]uint16, len(raw)/2)
	for i := range u {
		u[i] = binary.LittleEndian.Uint16(raw[2*i:])
	}
	if len(u) > 0 && u[len(u)-1] == 0 {
		u = u[:len(u)-1]
	}
	return string(utf16.Decode(u))
}

// appendUTF16 writes s as UTF-16LE with a terminating NUL, as real clients do.
func appendUTF16(dst []byte, s string) []byte {
	for _, c := range utf16.Encode([]rune(s)) {
		dst = binary.LittleEndian.AppendUint16(dst, c)
	}
	return append(dst, 0, 0)
}

// utf16Len is the encoded size of s with its NUL.
func utf16Len(s string) int {
	return 2*len(utf16.Encode([]rune(s))) + 2
}

func appendUnicodeString(dst []byte, s string, what string) ([]byte, error) {
	n := utf16Len(s)
	if n > 0xFFFF {
		return dst, fmt.Errorf("tsgu: %s is %d bytes as UTF-16, over 65535", what, n)
	}
	dst = binary.LittleEndian.AppendUint16(dst, uint16(n))
	return appendUTF16(dst, s), nil
}

func appendBlob(dst []byte, b []byte, what string) ([]byte, error) {
	if len(b) > 0xFFFF {
		return dst, fmt.Errorf("tsgu: %s is %d bytes, over 65535", what, len(b))
	}
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(b)))
	return append(dst, b...), nil
}

// appendOptBlob is appendBlob for a blob that fieldsPresent may leave
// out: nil writes nothing.
func appendOptBlob(dst []byte, b []byte, what string) ([]byte, error) {
	if b == nil {
		return dst, nil
	}
	return appendBlob(dst, b, what)
}
