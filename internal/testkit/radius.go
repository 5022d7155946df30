package testkit

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const radiusdConf = `prefix = /usr
exec_prefix = /usr
sysconfdir = /etc
localstatedir = /var
sbindir = /usr/sbin
logdir = %[1]s
raddbdir = %[1]s
radacctdir = %[1]s
name = radiusd
confdir = %[1]s
modconfdir = %[1]s
run_dir = %[1]s
db_dir = %[1]s
libdir = /usr/lib/freeradius
pidfile = %[1]s/radiusd.pid
max_request_time = 10
cleanup_delay = 2
max_requests = 1024
hostname_lookups = no
log {
  destination = stdout
  auth = yes
}
security {
  allow_core_dumps = no
  max_attributes = 200
  reject_delay = 0
  status_server = no
}
thread pool {
  start_servers = 1
  max_servers = 4
  min_spare_servers = 1
  max_spare_servers = 2
}
client local {
  ipaddr = 127.0.0.1
  secret = %[2]s
  require_message_authenticator = yes
}
modules {
  files {
    filename = %[1]s/users
  }
}
server default {
  listen {
    type = auth
    ipaddr = 127.0.0.1
    port = %[3]d
  }
  authorize {
    files
  }
  authenticate {
  }
  # Sign every answer (Blast-RADIUS, CVE-2024-3596): FreeRADIUS 3.2.5 and
  # later do it by themselves; Debian 12's 3.2.1 does it when told so.
  post-auth {
    update reply {
      Message-Authenticator := 0x00
    }
    Post-Auth-Type REJECT {
      update reply {
        Message-Authenticator := 0x00
      }
    }
  }
}
`

// FreeRADIUS starts a real FreeRADIUS on a loopback UDP port with the given
// users file (FreeRADIUS "files" module syntax) and returns its address and
// shared secret. It insists on Message-Authenticator in every request.
func FreeRADIUS(t testing.TB, users string) (addr, secret string) {
	t.Helper()
	Require(t, "freeradius")
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	pc.Close()
	dir := t.TempDir()
	secret = "deskway-radius-secret"
	if err := os.WriteFile(filepath.Join(dir, "radiusd.conf"), []byte(fmt.Sprintf(radiusdConf, dir, secret, port)), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "users"), []byte(users), 0o640); err != nil {
		t.Fatal(err)
	}
	p := Start(t, nil, "freeradius", "-f", "-d", dir, "-n", "radiusd", "-l", "stdout")
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(p.Log.String(), "Ready to process requests") {
		if time.Now().After(deadline) {
			t.Fatalf("FreeRADIUS did not start:\n%s", p.Log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Sprintf("127.0.0.1:%d", port), secret
}
