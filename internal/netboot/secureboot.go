package netboot

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
)

// With stream.netboot.secure_boot, an x86-64 UEFI PXE client loads the
// chain Debian signs, since firmware with Secure Boot on runs only what a
// key of its db signed (on PCs, Microsoft's UEFI CA) and Debian's
// ipxe.efi is signed by no one: shim (signed by Microsoft, carrying
// Debian's CA) loads GRUB (signed by Debian) from its own TFTP directory
// under the name grubx64.efi; Debian's network GRUB reads its
// configuration at its built-in prefix, /grub, and loads the kernel,
// which shim checks against Debian's CA, over TFTP too: Debian's
// grubnetx64 carries TFTP and no HTTP.
const (
	sbShim = "shimx64.efi"
	sbGrub = "grubx64.efi"
	// sbConfig is the configuration grubnetx64 asks for first
	// (grub/x86_64-efi/grub.cfg, refused, comes before it); it names
	// the machine's own, which deviceScript decides.
	sbConfig       = "grub/grub.cfg"
	sbDevicePrefix = "grub/device-"
	sbDeviceSuffix = ".cfg"
	sbVDisks       = "netboot/vdisks/"
)

// secureBootFile opens the Secure Boot chain's TFTP file name for the
// client at remote; nil means deskway serves no such file.
func (s *Service) secureBootFile(name, remote string) func() (io.ReadCloser, int64, error) {
	text := func(body string) func() (io.ReadCloser, int64, error) {
		return func() (io.ReadCloser, int64, error) {
			return io.NopCloser(strings.NewReader(body)), int64(len(body)), nil
		}
	}
	switch {
	case name == sbShim:
		return openFile(s.cfg.Shim)
	case name == sbGrub:
		return openFile(s.cfg.Grub)
	case name == sbConfig:
		// GRUB fills in the MAC of the card it booted from. A machine
		// that may not boot is told why and asks again after a while, in
		// a loop: configfile would nest one level deeper every time.
		return text(fmt.Sprintf("while true; do\n  source (tftp,%s)/%s${net_default_mac}%s\n  sleep --interruptible %d\ndone\n",
			s.cfg.Address, sbDevicePrefix, sbDeviceSuffix, int(retryAfter.Seconds())))
	case strings.HasPrefix(name, sbDevicePrefix) && strings.HasSuffix(name, sbDeviceSuffix):
		mac := strings.TrimSuffix(strings.TrimPrefix(name, sbDevicePrefix), sbDeviceSuffix)
		cfg, err := s.grubConfig(mac, remote)
		if err != nil {
			// Said on the machine's console, which asks again after the
			// loop's wait.
			s.log.Warn("Secure Boot: no GRUB configuration for a machine", "mac", mac, "remote", remote, "error", err)
			cfg = fmt.Sprintf("echo %s\necho %s\n", grubQuote(fmt.Sprintf("deskway: this machine (%s) cannot be booted through Secure Boot's GRUB as its device is set up (a boot menu, for one, is iPXE's only).", mac)),
				grubQuote("deskway: the stream server's log says why; trying again in a minute."))
		}
		return text(cfg)
	case strings.HasPrefix(name, sbVDisks):
		vd, file, _ := strings.Cut(strings.TrimPrefix(name, sbVDisks), "/")
		v, ok := s.vdisks[vd]
		path := map[string]string{"kernel": v.Kernel, "initrd": v.Initrd}[file]
		if !ok || path == "" {
			return nil
		}
		return openFile(path)
	}
	return nil
}

func openFile(path string) func() (io.ReadCloser, int64, error) {
	return func() (io.ReadCloser, int64, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, 0, err
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, 0, err
		}
		return f, fi.Size(), nil
	}
}

// grubConfig is the GRUB configuration of the machine with mac: the same
// decision as its iPXE script (deviceScript: boot its vDisk, or say why
// not), in GRUB's words, its files over TFTP.
func (s *Service) grubConfig(mac, remote string) (string, error) {
	rec := &scriptRecorder{header: http.Header{}}
	req, err := http.NewRequest(http.MethodGet, "/netboot/device?mac="+url.QueryEscape(mac), nil)
	if err != nil {
		return "", fmt.Errorf("netboot: %w", err)
	}
	req.RemoteAddr = remote
	s.deviceScript(rec, req)
	if rec.status != 0 && rec.status != http.StatusOK {
		return "", fmt.Errorf("netboot: %s", strings.TrimSpace(rec.body.String()))
	}
	return ipxeToGrub(rec.body.String(), s.base(), fmt.Sprintf("(tftp,%s)", s.cfg.Address))
}

// ipxeToGrub says what the iPXE script of deviceScript says, in GRUB's
// configuration language: echo, linux and initrd (files under base
// fetched from root instead) and boot. Its wait and retry are grub.cfg's
// loop. A line it does not know is an error, not a step left out.
func ipxeToGrub(script, base, root string) (string, error) {
	var b strings.Builder
	for _, line := range strings.Split(script, "\n") {
		cmd, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch {
		case cmd == "" || cmd == "#!ipxe" || cmd == ":retry" || cmd == "chain":
		case cmd == "echo":
			fmt.Fprintf(&b, "echo %s\n", grubQuote(rest))
		case cmd == "prompt":
			if !strings.HasSuffix(rest, "|| goto retry") {
				return "", fmt.Errorf("netboot: iPXE prompt %q does not go on to ask again", rest)
			}
			b.WriteString("echo 'Press Esc to try again now'\n")
		case cmd == "kernel":
			file, args, _ := strings.Cut(rest, " ")
			path, ok := strings.CutPrefix(file, base+"/")
			if !ok {
				return "", fmt.Errorf("netboot: iPXE kernel %s is not under %s", file, base)
			}
			// initrd=NAME is iPXE's name for the initramfs it hands a
			// UEFI kernel; a kernel that GRUB boots would look for a
			// file of that name and stop when it finds none.
			var keep []string
			for _, a := range strings.Fields(args) {
				if !strings.HasPrefix(a, "initrd=") {
					keep = append(keep, a)
				}
			}
			fmt.Fprintf(&b, "linux %s/%s %s\n", root, path, strings.Join(keep, " "))
		case cmd == "initrd":
			f := strings.Fields(rest)
			path, ok := strings.CutPrefix(f[len(f)-1], base+"/")
			if !ok {
				return "", fmt.Errorf("netboot: iPXE initrd %s is not under %s", f[len(f)-1], base)
			}
			fmt.Fprintf(&b, "initrd %s/%s\n", root, path)
		case cmd == "boot":
			b.WriteString("boot\n")
		default:
			return "", fmt.Errorf("netboot: the iPXE line %q has no GRUB equivalent here", line)
		}
	}
	return b.String(), nil
}

// grubQuote quotes s as one GRUB word: single quotes take everything
// literally but a single quote.
func grubQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// scriptRecorder keeps what deviceScript writes, for grubConfig.
type scriptRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *scriptRecorder) Header() http.Header         { return r.header }
func (r *scriptRecorder) Write(b []byte) (int, error) { return r.body.Write(b) }
func (r *scriptRecorder) WriteHeader(status int)      { r.status = status }
