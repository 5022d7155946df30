package netboot

import (
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// retryAfter is how long an iPXE script that does not boot waits before
// asking again, so that a device an administrator enables or assigns
// boots without a power cycle.
const retryAfter = 60 * time.Second

// Handler serves the boot network's HTTP: the iPXE scripts, and the
// kernels and initramfs images of the vDisks.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /netboot/boot.ipxe", func(w http.ResponseWriter, _ *http.Request) {
		// iPXE fills in the MAC of the interface it booted from.
		writeScript(w, fmt.Sprintf("chain %s/netboot/device?mac=${netX/mac}\n", s.base()))
	})
	mux.HandleFunc("GET /netboot/device", s.deviceScript)
	for _, name := range slices.Compact(slices.Sorted(maps.Values(httpBootStages))) {
		// UEFI HTTP Boot loads only a 200 with Content-Length (which
		// ServeFile sets) of an EFI application.
		mux.HandleFunc("GET /netboot/"+name, func(w http.ResponseWriter, r *http.Request) {
			path := filepath.Join(s.cfg.IPXEDir, name)
			if _, err := os.Stat(path); err != nil {
				s.log.Warn("HTTP Boot: iPXE first stage missing (install Debian's ipxe package, or set stream.netboot.ipxe_dir)", "error", err)
				http.NotFound(w, r)
				return
			}
			w.Header().Set("Content-Type", "application/efi")
			http.ServeFile(w, r, path)
		})
	}
	mux.HandleFunc("GET /netboot/vdisks/{name}/{file}", func(w http.ResponseWriter, r *http.Request) {
		v, ok := s.vdisks[r.PathValue("name")]
		path := map[string]string{"kernel": v.Kernel, "initrd": v.Initrd}[r.PathValue("file")]
		if !ok || path == "" {
			http.NotFound(w, r)
			return
		}
		http.ServeFile(w, r, path)
	})
	return mux
}

func (s *Service) base() string {
	return fmt.Sprintf("http://%s:%d", s.cfg.Address, s.cfg.HTTPPort)
}

func writeScript(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = fmt.Fprintf(w, "#!ipxe\n%s", body)
}

// deviceScript answers a device's iPXE: its vDisk's kernel and initramfs
// with the command line that names its root disk, or, for a machine that
// may not boot, why, on its console, asked again after a minute.
func (s *Service) deviceScript(w http.ResponseWriter, r *http.Request) {
	mac, err := ParseMAC(r.URL.Query().Get("mac"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	now := s.now()
	d, known := s.devices.ByMAC(mac)
	entry := r.URL.Query().Get("entry")
	chooseErr := d.choose(entry)
	refuse := func(result string, lines ...string) {
		s.m.scripts.WithLabelValues(result).Inc()
		s.log.Info("network boot refused", "mac", mac, "device", d.Name, "reason", result, "remote", r.RemoteAddr)
		var b strings.Builder
		for _, l := range lines {
			fmt.Fprintf(&b, "echo deskway: %s\n", l)
		}
		fmt.Fprintf(&b, "prompt --timeout %d Press a key to try again now || goto retry\n:retry\nchain %s/netboot/device?mac=%s || shell\n",
			retryAfter.Milliseconds(), s.base(), mac)
		writeScript(w, b.String())
	}
	switch {
	case !known && s.cfg.AutoAdd != "" && s.devices.pending(s.cfg.AutoAdd) >= maxPending:
		refuse("unknown", fmt.Sprintf("this machine (%s) is not a registered device, and %d machines already wait in collection %s.", mac, maxPending, s.cfg.AutoAdd),
			"An administrator assigns or removes those first, or adds this one with:",
			fmt.Sprintf("deskway device add --mac %s --name NAME --vdisk VDISK", mac))
	case !known && s.cfg.AutoAdd != "":
		d = Device{MAC: mac, Name: "pxe-" + strings.ReplaceAll(mac, ":", ""), Collection: s.cfg.AutoAdd, Added: now}
		if err := s.devices.Add(d); err != nil {
			s.log.Warn("could not add a network-booting machine", "mac", mac, "error", err)
		} else {
			s.log.Info("network-booting machine added, disabled until a vDisk is assigned", "mac", mac, "device", d.Name, "collection", d.Collection)
		}
		refuse("added", fmt.Sprintf("this machine (%s) was added as device %s in collection %s.", mac, d.Name, d.Collection),
			"It boots once an administrator assigns it a vDisk and enables it:",
			fmt.Sprintf("deskway device assign %s --vdisk NAME; deskway device enable %s", d.Name, d.Name))
	case !known:
		refuse("unknown", fmt.Sprintf("this machine (%s) is not a registered device.", mac),
			"An administrator adds it with:",
			fmt.Sprintf("deskway device add --mac %s --name NAME --vdisk VDISK", mac))
	case !d.Enabled:
		refuse("disabled", fmt.Sprintf("device %s (%s) is disabled by an administrator.", d.Name, mac),
			fmt.Sprintf("It boots again after: deskway device enable %s", d.Name))
	case chooseErr != nil:
		// The entry is the requester's: it stays out of the script.
		s.log.Info("network boot entry refused", "mac", mac, "device", d.Name, "entry", entry, "reason", chooseErr)
		refuse("not_in_menu", fmt.Sprintf("device %s (%s) asked to boot what its boot menu does not offer.", d.Name, mac),
			"It boots one of its menu's entries; an administrator changes the menu with:",
			fmt.Sprintf("deskway device menu %s VDISK[@STAGE]...", d.Name))
	case d.Menu != nil && entry == "":
		s.m.scripts.WithLabelValues("menu").Inc()
		s.log.Info("network boot menu", "mac", mac, "device", d.Name, "entries", strings.Join(d.Menu.Entries, ","), "remote", r.RemoteAddr)
		writeScript(w, s.menuScript(d))
	case d.VDisk == "":
		refuse("unassigned", fmt.Sprintf("device %s (%s) has no vDisk assigned.", d.Name, mac),
			fmt.Sprintf("deskway device assign %s --vdisk NAME", d.Name))
	case s.vdisks[d.VDisk].Kernel == "":
		refuse("no_kernel", fmt.Sprintf("vDisk %s of device %s has no kernel and initrd to network-boot.", d.VDisk, d.Name),
			"Set kernel and initrd for it in stream.vdisks.")
	default:
		v := s.vdisks[d.VDisk]
		boot := newBootID()
		export := d.VDisk
		if d.Stage != "" && d.Stage != "production" {
			export += "@" + d.Stage
		}
		export += "/" + d.Name
		if v.Mode == "private" {
			boot = "private" // its own image, kept across power-ons
		} else {
			export += "/" + boot // a fresh write cache every power-on
		}
		// BOOTIF (PXELINUX's, which initramfs-tools and dracut read too)
		// names the card the machine booted from among several.
		args := strings.TrimSpace(fmt.Sprintf("initrd=initrd %s deskway.device=%s deskway.export=%s deskway.mode=%s deskway.servers=%s BOOTIF=01-%s%s",
			v.Cmdline, d.Name, export, v.Mode, strings.Join(s.balance.order(s.servers, now), ","), strings.ReplaceAll(mac, ":", "-"), PersonalityArgs(d.Personality)))
		s.devices.booted(mac, now)
		s.m.scripts.WithLabelValues("boot").Inc()
		s.log.Info("network boot", "mac", mac, "device", d.Name, "vdisk", d.VDisk, "stage", d.Stage, "boot", boot, "remote", r.RemoteAddr)
		writeScript(w, fmt.Sprintf("echo deskway: device %s boots vDisk %s (boot %s)\nkernel %s/netboot/vdisks/%s/kernel %s\ninitrd --name initrd %s/netboot/vdisks/%s/initrd\nboot\n",
			d.Name, d.VDisk, boot, s.base(), d.VDisk, args, s.base(), d.VDisk))
	}
}
