package gateway

// GCPercent is the garbage collector's target (runtime/debug.SetGCPercent)
// for a process that runs the gateway alone, when GOGC does not set one.
// An open tunnel keeps about 12 KiB live on the heap (crypto/tls's
// ciphers and record buffers, the tunnel's own state), and Go's default
// of 100 lets the heap grow to twice what is live before it collects:
// most of a tunnel's resident memory was that headroom. The relay itself
// allocates almost nothing per round trip (one 16-byte object per TLS
// record crypto/tls reads), so collecting at a quarter over live costs
// little CPU once tunnels are open; opening them, whose handshakes do
// allocate, collects about four times as often as by default.
const GCPercent = 25
