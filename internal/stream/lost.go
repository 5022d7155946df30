package stream

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// lostHint tells how a refused client gets its disk back. A client whose
// export name carries a boot id starts a new boot by booting again; one
// with a fixed name (VDISK/CLIENT) boots under the same name every time,
// so only an administrator forgetting the lost boot lets it in again.
func lostHint(vdisk, client, id string) string {
	if id != "" {
		return "reboot the client, which starts a new boot"
	}
	return fmt.Sprintf("the export name has no boot id, so the client cannot start a new boot itself: run `deskway stream forget-lost %s %s` (DELETE /api/v1/stream/vdisks/%s/clients/%s/lost) and its next connection starts a new boot from the vDisk",
		vdisk, client, vdisk, client)
}

// ForgetLost forgets every lost boot of client on the vDisk named vdisk,
// at every stage and boot id, so that the client's next connection
// starts a new boot instead of being refused: the way back for a client
// with a fixed export name, which cannot pick a new boot id. It returns
// the boots forgotten (VDISK[@STAGE]/CLIENT/BOOT).
func (s *Server) ForgetLost(vdisk, client string) ([]string, error) {
	vd := s.byName[vdisk]
	if vd == nil {
		return nil, fmt.Errorf("no vDisk named %q", vdisk)
	}
	ofDisk := func(disk string) bool { return disk == vd.name || strings.HasPrefix(disk, vd.name+"@") }
	var out []string
	if s.bootLog != nil {
		keys, err := s.bootLog.forget(func(key string) bool {
			p := strings.SplitN(key, "/", 3)
			return len(p) == 3 && ofDisk(p[0]) && p[1] == client
		})
		if err != nil {
			return nil, err
		}
		out = append(out, keys...)
	}
	// With shared caches a lost boot is its swept directory on the store.
	dirs, _ := filepath.Glob(filepath.Join(s.cfg.Store, "cache", "*", client, "*"))
	for _, dir := range dirs {
		disk := filepath.Base(filepath.Dir(filepath.Dir(dir)))
		if _, swept := sweptAt(dir); !swept || !ofDisk(disk) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			return out, fmt.Errorf("stream: forget a lost boot: %w", err)
		}
		id := filepath.Base(dir)
		if id == "-" {
			id = ""
		}
		out = append(out, disk+"/"+client+"/"+id)
	}
	sort.Strings(out)
	if len(out) > 0 {
		s.log.Warn("lost boots forgotten: the client's next connection starts a new boot", "vdisk", vd.name, "client", client, "boots", out)
	}
	return out, nil
}
