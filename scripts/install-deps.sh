#!/usr/bin/env bash
# Installs what the tests drive, from Debian's packages, only when missing.
# Safe to run again: a machine that has everything installs nothing.
set -euo pipefail

packages=(
  xrdp xorgxrdp freerdp2-x11 xvfb xterm imagemagick   # RDP host, client, display, screenshots
  twm                                                  # the window manager of make run's demo desktop
  x11-utils                                            # xmessage for session messages, xwininfo to see them, xdpyinfo for a resized session
  xdotool vim-tiny                                     # the session-host bench's workload types into an editor in each desktop
  xclip xinput x11-xserver-utils                       # the session's clipboard, the keys that reach it and its keymap (xmodmap), for browser desktops
  chromium                                             # the portal tested in a real browser (chromedp)
  slapd ldap-utils                                     # a real LDAP directory for the portal's sign-in (tests start their own)
  freeradius freeradius-utils                          # central policy (RADIUS) tests
  haproxy                                              # baseline relay for benchmarks
  libnbd-bin python3-libnbd qemu-utils                 # NBD clients for the vDisk streaming tests (nbdinfo, nbdcopy, nbdsh)
  nbdkit nbd-server                                    # reference NBD servers: client tests, boot-storm peers
  dnsmasq-base                                         # the LTSP way beside deskway in the netboot bench: proxyDHCP and TFTP (dnsmasq's binary, no system service)
  qemu-system-x86 busybox-static e2fsprogs             # diskless VMs booting a vDisk
  ipxe iproute2                                        # iPXE first stages the netboot TFTP serves (undionly.kpxe, ipxe.efi)
  ovmf                                                 # UEFI firmware for the network-boot VMs (PXE and HTTP Boot; Secure Boot with Microsoft's keys)
  shim-signed grub-efi-amd64-signed                    # the signed chain netboot's secure_boot serves (shimx64.efi, grubnetx64.efi)
  ndisc6                                               # rdisc6: an IPv6 router-discovery client for the boot network's advertisements
  wireguard-tools                                      # wg: configures the office peer (wireguard-go) in the WireGuard site tests
  postgresql                                           # the broker's shared database (tests start their own clusters)
  strace                                               # watching the stream server sync what FUA and FLUSH acknowledge
  tshark python3-scapy                                 # the site gateway's GRE on the wire: decoded by tshark, bad frames built by scapy
  podman runc                                          # running the container image (runc: crun refuses hybrid cgroups)
  frr                                                  # the tenant's router for the site gateway's BGP tests (tests start their own bgpd)
  clang-14 llvm-14 libbpf-dev                          # the site gateway's kernel datapath: bpf2go compiles internal/site/kernelgre/bpf/gre.c (a test checks the committed object)
)

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH=/usr/local/go/bin:$PATH
fi
if ! command -v go >/dev/null 2>&1; then
  echo "install-deps: Go is not installed; deskway needs the Go toolchain named in go.mod (go.dev/dl)" >&2
  exit 1
fi

# One dpkg-query for all of them: one a package read the status database
# forty times over.
declare -A installed=()
while read -r p status; do
  [[ $status == "install ok installed" ]] && installed[$p]=1
done < <(dpkg-query -W -f='${Package} ${Status}\n' "${packages[@]}" 2>/dev/null || true)
missing=()
for p in "${packages[@]}"; do
  [[ -n ${installed[$p]:-} ]] || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "install-deps: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian starts these on install; tests start their own on loopback.
  for svc in xrdp xrdp-sesman freeradius haproxy nbd-server postgresql slapd frr; do
    systemctl disable --now "$svc" >/dev/null 2>&1 || service "$svc" stop >/dev/null 2>&1 || true
  done
  pkill -x xrdp-sesman 2>/dev/null || true
  pkill -x xrdp 2>/dev/null || true
  pkill -x freeradius 2>/dev/null || true
  pkill -x haproxy 2>/dev/null || true
  pkill -x nbd-server 2>/dev/null || true
fi
# A Debian kernel for the diskless-boot tests, unpacked (never installed)
# with only the modules a virtio disk with ext4 needs, and those of a
# network-booted machine's root disk (virtio-net, the kernel NBD client).
# It is Debian's signed kernel (linux-image-VERSION-amd64, built from
# linux-signed-amd64; modules signed too), which shim lets boot under
# Secure Boot.
kdir=/var/cache/deskway/kernel
if ! ls "$kdir"/boot/vmlinuz-* >/dev/null 2>&1 || ! ls "$kdir"/lib/modules/*/kernel/drivers/block/nbd.ko >/dev/null 2>&1; then
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  if [ -z "$pkg" ]; then
    apt-get update -qq
    pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  fi
  echo "install-deps: unpacking $pkg into $kdir"
  tmp=$(mktemp -d)
  (cd "$tmp" && apt-get download -qq "$pkg" 2>/dev/null)
  mkdir -p "$kdir.new"
  dpkg-deb -x "$tmp"/*.deb "$kdir.new"
  find "$kdir.new"/lib/modules -name '*.ko' \
    ! -path '*/fs/ext4/*' ! -path '*/fs/jbd2/*' ! -name mbcache.ko ! -name crc16.ko \
    ! -name crc32c_generic.ko ! -path '*/drivers/virtio/*' ! -name virtio_blk.ko \
    ! -name nbd.ko ! -name virtio_net.ko ! -name net_failover.ko ! -name failover.ko -delete
  rm -rf "$tmp" "$kdir"
  mv "$kdir.new" "$kdir"
fi

echo "install-deps: all test dependencies present"
