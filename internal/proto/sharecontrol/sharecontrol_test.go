package sharecontrol

import (
	"bytes"
	"encoding/hex"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Output PDUs as xrdp 0.9.21 sends them while it resizes a session: TPKT,
// X.224 Data, MCS Send Data Indication (initiator 1, I/O channel 1003)
// with a one-byte length, and the Share Control PDU.
const (
	// The Deactivate All: a Share Control Header (totalLength 6, pduType
	// 0x16, pduSource 1002) with nothing after it.
	xrdpDeactivate = "03000014" + "02f080" + "68000103eb70" + "06" + "06001600ea03"
	// The start of a Demand Active whose shareID is 0xe2b503ee.
	hexDemandActive = "0300001a" + "02f080" + "68000103eb70" + "0c" + "0c001100ea03" + "ee03b5e2" + "0100"
	// Data PDUs (shareID, pad, stream, uncompressedLength, pduType2,
	// compression, compressedLength, then the body): Synchronize (0x1f),
	// Control (0x14), a bitmap Update (0x02), Font Map (0x28).
	synchronize = "03000022" + "02f080" + "68000103eb70" + "14" + "14001700ea03" + "ee03b5e2" + "000100001f000000" + "0100"
	control     = "03000022" + "02f080" + "68000103eb70" + "14" + "14001700ea03" + "ee03b5e2" + "0001000014000000" + "0400"
	update      = "03000022" + "02f080" + "68000103eb70" + "14" + "14001700ea03" + "ee03b5e2" + "0001000002000000" + "0100"
	hexFontMap  = "03000022" + "02f080" + "68000103eb70" + "14" + "14001700ea03" + "ee03b5e2" + "0001000028000000" + "0000"
	// A fast-path bitmap update (the sort xrdp sends most of).
	fastPath = "0009" + "0104000100" + "0000"
)

// The Deactivate All completed with the share's ID: two-byte MCS length
// 13, totalLength 13, shareID, lengthSourceDescriptor 1, descriptor 0.
const completedDeactivate = "0300001c" + "02f080" + "68000103eb70" + "800d" + "0d001600ea03" + "ee03b5e2" + "0100" + "00"

func pass(t *testing.T, r *Reactivation, h string) (string, Event) {
	t.Helper()
	out, ev := r.Pass([]byte("kept:"), unhex(t, h))
	if !bytes.HasPrefix(out, []byte("kept:")) {
		t.Fatalf("dst was not appended to: %x", out)
	}
	return hex.EncodeToString(out[5:]), ev
}

// TestResize is xrdp's resize as the browser's client must see it: the
// short Deactivate All completed with the share's ID, the Demand Active
// and the finalization passed at once, and the screen's updates (slow
// and fast path) held until the Font Map has gone, then in their order.
func TestResize(t *testing.T) {
	var r Reactivation
	steps := []struct {
		in, out string
		ev      Event
	}{
		{hexDemandActive, hexDemandActive, None},
		{update, update, None}, // a session at work: nothing held
		{xrdpDeactivate, completedDeactivate, Completed},
		{hexDemandActive, hexDemandActive, None},
		{fastPath, "", None},
		{update, "", None},
		{synchronize, synchronize, None},
		{control, control, None},
		{hexFontMap, hexFontMap + fastPath + update, Finished},
		{fastPath, fastPath, None},
	}
	for i, s := range steps {
		out, ev := pass(t, &r, s.in)
		if out != s.out || ev != s.ev {
			t.Fatalf("step %d: got %s (event %d), want %s (event %d)", i, out, ev, s.out, s.ev)
		}
	}
}

// TestWholeDeactivateHolds: a host that sends the whole Deactivate All
// (Windows) has it passed as it is; its graphics before the Font Map are
// held just the same.
func TestWholeDeactivateHolds(t *testing.T) {
	var r Reactivation
	whole := "0300001b" + "02f080" + "68000103eb70" + "0d" + "0d001600ea03" + "ee03b5e2" + "0100" + "00"
	for i, s := range []struct{ in, out string }{{whole, whole}, {update, ""}, {hexFontMap, hexFontMap + update}} {
		if out, _ := pass(t, &r, s.in); out != s.out {
			t.Fatalf("step %d: got %s, want %s", i, out, s.out)
		}
	}
}

// TestOverflow: held output past MaxHeld goes out at once, in order.
func TestOverflow(t *testing.T) {
	r := Reactivation{MaxHeld: 40}
	pass(t, &r, xrdpDeactivate)
	if out, _ := pass(t, &r, update); out != "" {
		t.Fatalf("not held: %s", out)
	}
	out, ev := pass(t, &r, update)
	if ev != Overflowed || out != update+update {
		t.Fatalf("got %s (event %d)", out, ev)
	}
	if out, _ := pass(t, &r, update); out != update {
		t.Fatalf("after an overflow, output is still held: %s", out)
	}
}

// TestLeavesOthersAlone: PDUs whose lengths disagree or whose type is
// another are not taken for a Deactivate All.
func TestLeavesOthersAlone(t *testing.T) {
	for name, h := range map[string]string{
		"TPKT length": "03000015" + "02f080" + "68000103eb70" + "06" + "06001600ea03",
		"MCS length":  "03000014" + "02f080" + "68000103eb70" + "07" + "06001600ea03",
		"other type":  "03000014" + "02f080" + "68000103eb70" + "06" + "06001800ea03",
		"fast-path":   fastPath,
	} {
		var r Reactivation
		if out, ev := pass(t, &r, h); out != h || ev != None {
			t.Errorf("%s: got %s (event %d)", name, out, ev)
		}
		if out, _ := pass(t, &r, update); out != update {
			t.Errorf("%s: began holding output", name)
		}
	}
}

// FuzzPass: whatever the host sends, no byte is lost or made up: what
// went out and what is held is what came in, plus the 7 or 8 bytes each
// completion adds; and each PDU's bytes appear, in order, in the output.
func FuzzPass(f *testing.F) {
	seed := func(hs ...string) []byte {
		var b []byte
		for _, h := range hs {
			p := unhex(f, h)
			b = append(append(b, byte(len(p))), p...)
		}
		return b
	}
	f.Add(seed(hexDemandActive, xrdpDeactivate, hexDemandActive, update, fastPath, synchronize, hexFontMap, update))
	f.Add(seed(xrdpDeactivate, update, update, update))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := Reactivation{MaxHeld: 64}
		var out []byte
		inLen, grown := 0, 0
		for len(in) > 0 {
			n := int(in[0])
			in = in[1:]
			n = min(n, len(in))
			pdu := bytes.Clone(in[:n])
			in = in[n:]
			before := len(out)
			var ev Event
			out, ev = r.Pass(out, pdu)
			inLen += n
			if ev == Completed {
				if g := len(out) - before - n; g != 7 && g != 8 {
					t.Fatalf("a completion added %d bytes", g)
				}
				grown += len(out) - before - n
			}
			if len(out)+len(r.held) != inLen+grown {
				t.Fatalf("%d bytes out and %d held for %d in (+%d)", len(out), len(r.held), inLen, grown)
			}
		}
	})
}
