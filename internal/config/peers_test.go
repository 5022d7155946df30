package config

import (
	"strings"
	"testing"
	"time"
)

// TestBrokerPeers: broker.peers are https URLs of other brokers on the
// same PostgreSQL database, each once, asked within a peer_timeout
// shorter than a launch's own limit.
func TestBrokerPeers(t *testing.T) {
	const pg = "  database: postgres://deskway@db.example/deskway\n"
	c, err := Parse([]byte(brokerBase + pg + "  peers: [\"https://broker2.example:8444\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Broker.Peers) != 1 || c.Broker.PeerTimeout.D() != time.Second {
		t.Fatalf("peers %v, peer_timeout %s", c.Broker.Peers, c.Broker.PeerTimeout.D())
	}
	for conf, want := range map[string]string{
		pg + "  peers: [\"http://broker2.example:8444\"]\n":                                      "broker.peers[0]",
		pg + "  peers: [\"https://broker2.example:8444/api\"]\n":                                 "broker.peers[0]",
		pg + "  peers: [\"https://b2.example:8444\", \"https://b2.example:8444/\"]\n":            "listed twice",
		"  peers: [\"https://broker2.example:8444\"]\n":                                          "SQLite",
		pg + "  peers: [\"https://b2.example:8444\"]\n  peer_timeout: 30s\n":                     "broker.peer_timeout",
		pg + "  peers: [\"https://b2.example:8444\"]\n  peer_ca: /nonexistent/peers.pem\n":       "broker.peer_ca",
		pg + "  peers: [\"https://b2.example:8444\"]\n  peer_server_name: \"broker .example\"\n": "broker.peer_server_name",
	} {
		if _, err := Parse([]byte(brokerBase + conf)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error naming %s", conf, err, want)
		}
	}
}
