package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/gobwas/httphead"
	"github.com/gobwas/ws"
	"github.com/gobwas/ws/wsflate"
	"github.com/klauspost/compress/flate"

	"github.com/deskway/deskway/internal/config"
)

// Browser sessions compress what the gateway sends with permessage-deflate
// (RFC 7692), which Chromium and Firefox offer on every websocket: the web
// client gets no RDP bulk compression from xrdp, so without it a browser
// is sent about twice the bytes xfreerdp is for the same screen.
//
// With context takeover each message is compressed against the 32 KiB the
// session sent before it, as RDP's own bulk compression (MPPC, which xrdp
// gives xfreerdp) compresses against the 8 or 64 KiB before; a browser
// session is then no more open to a compression side channel (an observer
// of the encrypted lengths who can put content on the screen beside
// content they cannot see) than an RDP client with bulk compression, and
// less than one without it is to the lengths of the bitmap codecs
// themselves. It costs a deflate state per session; without context
// takeover no state is kept between messages, and each message's own
// repeats are all it finds.

// deflateNegotiation is what the gateway answered a browser's offer.
type deflateNegotiation struct {
	// header is the Sec-WebSocket-Extensions line of the 101 response,
	// empty when the extension is not used.
	header string
	// context is whether the gateway keeps its deflate context across
	// messages.
	context bool
}

// negotiateDeflate picks the first permessage-deflate offer among the
// client's extensions that mode allows the gateway to accept. The client's
// messages are asked to come without context takeover: what a browser
// sends is small, and its inflater then holds no state between messages.
func negotiateDeflate(h http.Header, mode string) (deflateNegotiation, error) {
	if mode == config.BrowserCompressionOff {
		return deflateNegotiation{}, nil
	}
	ext := wsflate.Extension{Parameters: wsflate.Parameters{
		ServerNoContextTakeover: mode == config.BrowserCompressionMessage,
		ClientNoContextTakeover: true,
	}}
	for _, v := range h.Values("Sec-WebSocket-Extensions") {
		opts, ok := httphead.ParseOptions([]byte(v), nil)
		if !ok {
			return deflateNegotiation{}, fmt.Errorf("Sec-WebSocket-Extensions %q cannot be parsed", v)
		}
		for _, o := range opts {
			acc, err := ext.Negotiate(o)
			if err != nil {
				return deflateNegotiation{}, fmt.Errorf("Sec-WebSocket-Extensions %q: %w", v, err)
			}
			if acc.Size() == 0 {
				continue
			}
			var b bytes.Buffer
			httphead.WriteOptions(&b, []httphead.Option{acc})
			return deflateNegotiation{header: b.String(), context: !ext.Parameters.ServerNoContextTakeover}, nil
		}
	}
	return deflateNegotiation{}, nil
}

// minDeflate is the smallest message worth compressing: below it deflate's
// block header and flush marker outweigh what it could save. An RFC 7692
// endpoint may send any message uncompressed.
const minDeflate = 64

// deflater compresses the messages of one browser session. It is used
// behind the transport's write gate, so messages are compressed in the
// order they are sent, as context takeover needs.
type deflater struct {
	fw  *flate.Writer // with context takeover, kept for the session
	buf bytes.Buffer
}

func newDeflater(context bool) (*deflater, error) {
	d := &deflater{}
	if context {
		// BestSpeed: the gateway relays many sessions on few cores, and a
		// higher level gained little on RDP's already coded bitmaps.
		fw, err := flate.NewWriter(&d.buf, flate.BestSpeed)
		if err != nil {
			return nil, fmt.Errorf("deflate: %w", err)
		}
		d.fw = fw
	}
	return d, nil
}

// compress returns p compressed as one message's payload (RFC 7692 7.2.1:
// flushed, without the final 00 00 ff ff); it stays valid until the next
// call.
func (d *deflater) compress(p []byte) ([]byte, error) {
	d.buf.Reset()
	if d.fw != nil {
		if _, err := d.fw.Write(p); err != nil {
			return nil, fmt.Errorf("deflate: %w", err)
		}
		if err := d.fw.Flush(); err != nil {
			return nil, fmt.Errorf("deflate: %w", err)
		}
	} else if err := flate.StatelessDeflate(&d.buf, p, false, nil); err != nil {
		return nil, fmt.Errorf("deflate: %w", err)
	}
	out := d.buf.Bytes()
	if !bytes.HasSuffix(out, flushTail) {
		return nil, errors.New("deflate: output does not end in a flush")
	}
	return out[:len(out)-len(flushTail)], nil
}

// flushTail ends every flushed deflate output (an empty stored block);
// RFC 7692 has it left off each message and put back before inflating.
var flushTail = []byte{0, 0, 0xff, 0xff}

// endTail is what the gateway puts after a client's message before
// inflating it: the flush marker the client left off, then a final empty
// stored block, so that the inflater ends at the message's end.
var endTail = []byte{0, 0, 0xff, 0xff, 1, 0, 0, 0xff, 0xff}

// maxInflated bounds what one compressed client message may inflate to:
// as much as one uncompressed frame may carry. What a browser sends (input,
// channel data) is far smaller, and a message of zeros cannot make the
// gateway inflate gigabytes.
const maxInflated = maxFrameLen

// inflater reads a client's messages when it negotiated
// permessage-deflate: compressed ones through a deflate reader, reset for
// each (the client keeps no context, as negotiated), others as they are.
type inflater struct {
	fr     io.ReadCloser
	active bool // a compressed message is being read
	tail   int  // of endTail, given to the deflate reader
	out    int  // bytes inflated from this message
}

// read is wsReader.Read for a client that may compress.
func (f *inflater) read(w *wsReader, p []byte) (int, error) {
	for {
		if f.active {
			if f.out >= maxInflated {
				return 0, fmt.Errorf("websocket: a compressed message inflates to more than %d bytes", maxInflated)
			}
			if len(p) > maxInflated-f.out {
				p = p[:maxInflated-f.out]
			}
			n, err := f.fr.Read(p)
			f.out += n
			if errors.Is(err, io.EOF) {
				f.active = false
				if n == 0 {
					continue
				}
				err = nil
			}
			if err != nil && !errors.Is(err, errWouldBlock) {
				err = fmt.Errorf("websocket: compressed message: %w", err)
			}
			return n, err
		}
		if w.left > 0 {
			return w.payload(p)
		}
		compressed, err := w.frame()
		if err != nil {
			return 0, err
		}
		if compressed {
			src := messageSource{w: w, f: f}
			if f.fr == nil {
				f.fr = flate.NewReader(src)
			} else if err := f.fr.(flate.Resetter).Reset(src, nil); err != nil {
				return 0, fmt.Errorf("websocket: compressed message: %w", err)
			}
			f.active, f.tail, f.out = true, 0, 0
		}
	}
}

// messageSource is the compressed payload of the client's current
// message, frame after frame, followed by endTail.
type messageSource struct {
	w *wsReader
	f *inflater
}

func (m messageSource) Read(p []byte) (int, error) {
	w := m.w
	for w.left == 0 {
		if w.fin {
			if m.f.tail == len(endTail) {
				return 0, io.EOF
			}
			n := copy(p, endTail[m.f.tail:])
			m.f.tail += n
			return n, nil
		}
		if _, err := w.frame(); err != nil {
			return 0, err
		}
		if !w.continued {
			return 0, errors.New("websocket: a new message began inside a fragmented one")
		}
	}
	return w.payload(p)
}

// writeBinary sends p as one binary message, compressed when the browser
// negotiated permessage-deflate.
func (t *browserTransport) writeBinary(p []byte) error {
	if err := t.g.lock(); err != nil {
		return err
	}
	defer t.g.unlock()
	if t.deflate == nil || len(p) < minDeflate {
		t.sent.Add(uint64(len(p)))
		return t.writeFrameLocked(ws.OpBinary, p)
	}
	c, err := t.deflate.compress(p)
	if err != nil {
		return err
	}
	t.sent.Add(uint64(len(c)))
	var hdr [10]byte
	n := putFrameHeader(hdr[:], ws.OpBinary, len(c))
	hdr[0] |= 0x40 // RSV1: compressed (RFC 7692 6)
	bufs := net.Buffers{hdr[:n], c}
	_, err = bufs.WriteTo(t.conn)
	return err
}
