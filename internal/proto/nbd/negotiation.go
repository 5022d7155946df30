package nbd

import (
	"fmt"
)

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
