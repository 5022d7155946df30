package gateway

import (
	"fmt"
	"net/url"
	"strconv"
)

// keyboardParam is the query parameter of the browser's websocket URL
// that names its keyboard layout: a Windows input locale identifier in
// hex, such as 040c for French. The portal's page picks it (the
// browser's keyboard or language, or the person's choice), since the
// browser client cannot: it sends layout 0 in its core data, and a host
// given 0 maps scancodes as US English.
const keyboardParam = "kbd"

// keyboardLayout reads the layout the page asked for; 0 means none. A
// value that is not one is an error, for the log: the session goes on
// with the host's default layout.
func keyboardLayout(q url.Values) (uint32, error) {
	v := q.Get(keyboardParam)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 16, 32)
	if err != nil || n == 0 || len(v) > 8 {
		return 0, fmt.Errorf("keyboard layout %q is not a non-zero hex input locale identifier", v)
	}
	return uint32(n), nil
}
