package stream

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Stages a version moves through: an administrator changes a maintenance
// version, test clients try it, then production clients boot it.
const (
	StageMaintenance = "maintenance"
	StageTest        = "test"
	StageProduction  = "production"
)

// Version is one entry of a vDisk's version chain. Version 0 is the
// configured base image.
type Version struct {
	Version int       `json:"version"`
	Parent  int       `json:"parent"`
	Stage   string    `json:"stage"`
	Created time.Time `json:"created"`
	// MergedBase is set for a version made by a merge: a full image that
	// starts a new chain.
	MergedBase string `json:"merged_base,omitempty"`
	Note       string `json:"note,omitempty"`
}

// manifest is versions.json.
type manifest struct {
	Versions []Version `json:"versions"`
}

// errVersion marks requests that do not fit the version chain's state.
var errVersion = errors.New("version")

func (vd *vdisk) versionsDir() string { return filepath.Join(vd.store, "versions", vd.name) }

func (vd *vdisk) deltaDir(n int) string {
	return filepath.Join(vd.versionsDir(), fmt.Sprintf("v%d", n))
}

// loadVersions reads versions.json when it changed since the last load
// (another server of the farm may have written it) and rebuilds the
// images clients of each stage boot. Callers hold vd.mu.
func (vd *vdisk) loadVersions() error {
	path := filepath.Join(vd.versionsDir(), "versions.json")
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		if vd.images == nil {
			im := &image{base: vd.f, baseFD: vd.fd, size: vd.size}
			vd.images = map[string]*image{StageProduction: im, StageTest: im}
		}
		return nil
	}
	if err != nil {
		return err
	}
	if vd.images != nil && fi.ModTime().Equal(vd.manifestTime) {
		return nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var m manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("vDisk %s: %s: %w", vd.name, path, err)
	}
	vd.manifest, vd.manifestTime = m, fi.ModTime()
	images := map[string]*image{}
	for _, stage := range []string{StageProduction, StageTest} {
		n := vd.newest(stage)
		im, err := vd.buildImage(n)
		if err != nil {
			return err
		}
		images[stage] = im
	}
	vd.images = images
	return nil
}

// newest is the newest version a client of stage boots: production
// clients the newest production version, test clients the newest test or
// production one.
func (vd *vdisk) newest(stage string) int {
	best := 0
	for _, v := range vd.manifest.Versions {
		ok := v.Stage == StageProduction || (stage == StageTest && v.Stage == StageTest)
		if ok && v.Version > best {
			best = v.Version
		}
	}
	return best
}

func (vd *vdisk) find(n int) (Version, bool) {
	for _, v := range vd.manifest.Versions {
		if v.Version == n {
			return v, true
		}
	}
	return Version{}, false
}

// buildImage opens version n: its delta and its ancestors' down to the
// nearest full image.
func (vd *vdisk) buildImage(n int) (*image, error) {
	if im, ok := vd.built[n]; ok {
		return im, nil
	}
	im := &image{version: n, base: vd.f, baseFD: vd.fd, size: vd.size}
	for cur := n; cur != 0; {
		v, ok := vd.find(cur)
		if !ok {
			return nil, fmt.Errorf("vDisk %s: version %d is missing from versions.json", vd.name, cur)
		}
		if v.MergedBase != "" {
			f, err := os.Open(v.MergedBase)
			if err != nil {
				return nil, fmt.Errorf("vDisk %s version %d: %w", vd.name, cur, err)
			}
			im.base, im.baseFD = f, int(f.Fd())
			break
		}
		d, err := loadDelta(vd.deltaDir(cur), cur, vd.size)
		if err != nil {
			return nil, err
		}
		im.deltas = append(im.deltas, d)
		cur = v.Parent
	}
	if vd.built == nil {
		vd.built = map[int]*image{}
	}
	if vd.manifestVersion(n).Stage != StageMaintenance {
		vd.built[n] = im // finished versions never change
	}
	return im, nil
}

func (vd *vdisk) manifestVersion(n int) Version {
	v, _ := vd.find(n)
	return v
}

func (vd *vdisk) saveManifest() error {
	if err := os.MkdirAll(vd.versionsDir(), 0o700); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(vd.manifest, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(vd.versionsDir(), "versions.json")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	vd.manifestTime = time.Time{} // reload on next use
	return vd.loadVersions()
}

// createVersion starts a maintenance version on top of the newest one.
func (vd *vdisk) createVersion(note string) (Version, error) {
	vd.mu.Lock()
	defer vd.mu.Unlock()
	if err := vd.loadVersions(); err != nil {
		return Version{}, err
	}
	parent := 0
	for _, v := range vd.manifest.Versions {
		if v.Stage == StageMaintenance {
			return Version{}, fmt.Errorf("%w: version %d is already in maintenance; promote it first", errVersion, v.Version)
		}
		parent = max(parent, v.Version)
	}
	v := Version{Version: parent + 1, Parent: parent, Stage: StageMaintenance, Created: time.Now().UTC(), Note: note}
	if err := os.MkdirAll(vd.deltaDir(v.Version), 0o700); err != nil {
		return Version{}, err
	}
	vd.manifest.Versions = append(vd.manifest.Versions, v)
	return v, vd.saveManifest()
}

// promote moves version n one stage on: maintenance to test to production.
func (vd *vdisk) promote(n int) (Version, error) {
	vd.mu.Lock()
	defer vd.mu.Unlock()
	if err := vd.loadVersions(); err != nil {
		return Version{}, err
	}
	for i, v := range vd.manifest.Versions {
		if v.Version != n {
			continue
		}
		switch v.Stage {
		case StageMaintenance:
			// The delta becomes read-only for good: nobody may be writing it.
			lock, err := os.OpenFile(filepath.Join(vd.deltaDir(n), "lock"), os.O_RDWR|os.O_CREATE, 0o600)
			if err != nil {
				return Version{}, err
			}
			defer lock.Close()
			if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
				return Version{}, fmt.Errorf("%w: version %d is open for maintenance by a client; disconnect it first", errVersion, n)
			}
			for _, f := range []string{"data", "map"} {
				// A maintenance version nobody wrote still needs its files.
				if fh, err := os.OpenFile(filepath.Join(vd.deltaDir(n), f), os.O_RDWR|os.O_CREATE, 0o600); err == nil {
					fh.Close()
				}
			}
			vd.manifest.Versions[i].Stage = StageTest
		case StageTest:
			vd.manifest.Versions[i].Stage = StageProduction
		default:
			return Version{}, fmt.Errorf("%w: version %d is already in production", errVersion, n)
		}
		out := vd.manifest.Versions[i]
		return out, vd.saveManifest()
	}
	return Version{}, fmt.Errorf("%w: no version %d", errVersion, n)
}

// merge writes the newest production version as one full image, which
// becomes a new production version that starts a fresh chain.
func (vd *vdisk) merge() (Version, error) {
	vd.mu.Lock()
	defer vd.mu.Unlock()
	if err := vd.loadVersions(); err != nil {
		return Version{}, err
	}
	im := vd.images[StageProduction]
	n := 0
	for _, v := range vd.manifest.Versions {
		n = max(n, v.Version)
		if v.Stage == StageMaintenance {
			return Version{}, fmt.Errorf("%w: version %d is in maintenance; promote it before merging", errVersion, v.Version)
		}
	}
	if len(im.deltas) == 0 {
		return Version{}, fmt.Errorf("%w: production version %d has no deltas to merge", errVersion, im.version)
	}
	if vd.merging {
		return Version{}, fmt.Errorf("%w: a merge is already running", errVersion)
	}
	next := n + 1
	path := filepath.Join(vd.versionsDir(), fmt.Sprintf("base-v%d.img", next))
	// The copy can take minutes: clients keep booting meanwhile.
	vd.merging = true
	vd.mu.Unlock()
	err := im.flatten(path)
	vd.mu.Lock()
	vd.merging = false
	if err != nil {
		return Version{}, fmt.Errorf("merge: %w", err)
	}
	if err := vd.loadVersions(); err != nil {
		return Version{}, err
	}
	for _, v := range vd.manifest.Versions {
		if v.Version >= next {
			_ = os.Remove(path)
			return Version{}, fmt.Errorf("%w: version %d appeared during the merge; merge again", errVersion, v.Version)
		}
	}
	v := Version{Version: next, Parent: im.version, Stage: StageProduction, Created: time.Now().UTC(), MergedBase: path,
		Note: fmt.Sprintf("merge of version %d", im.version)}
	vd.manifest.Versions = append(vd.manifest.Versions, v)
	return v, vd.saveManifest()
}

// versionList returns the chain with version 0, the configured base.
func (vd *vdisk) versionList() ([]Version, error) {
	vd.mu.Lock()
	defer vd.mu.Unlock()
	if err := vd.loadVersions(); err != nil {
		return nil, err
	}
	out := []Version{{Version: 0, Stage: StageProduction, Note: "base image " + vd.path}}
	return append(out, vd.manifest.Versions...), nil
}

// imageOf returns the image of finished version n, for a boot that
// started on it: a boot keeps its version to its end, on any server.
func (vd *vdisk) imageOf(n int) (*image, error) {
	vd.mu.Lock()
	defer vd.mu.Unlock()
	if err := vd.loadVersions(); err != nil {
		return nil, err
	}
	if _, ok := vd.find(n); !ok && n != 0 {
		return nil, fmt.Errorf("vDisk %s has no version %d", vd.name, n)
	}
	return vd.buildImage(n)
}

// imageFor returns the image a client of stage (production, test, or vN)
// boots, and for maintenance the version being edited.
func (vd *vdisk) imageFor(stage string) (*image, Version, error) {
	vd.mu.Lock()
	defer vd.mu.Unlock()
	if err := vd.loadVersions(); err != nil {
		return nil, Version{}, err
	}
	switch {
	case stage == "" || stage == StageProduction || stage == StageTest:
		if stage == "" {
			stage = StageProduction
		}
		im := vd.images[stage]
		return im, vd.manifestVersion(im.version), nil
	case stage == StageMaintenance:
		for _, v := range vd.manifest.Versions {
			if v.Stage == StageMaintenance {
				im, err := vd.buildImage(v.Parent)
				return im, v, err
			}
		}
		return nil, Version{}, fmt.Errorf("vDisk %s has no version in maintenance (create one through the admin API)", vd.name)
	case strings.HasPrefix(stage, "v"):
		n, err := strconv.Atoi(stage[1:])
		if err != nil {
			break
		}
		if _, ok := vd.find(n); !ok && n != 0 {
			return nil, Version{}, fmt.Errorf("vDisk %s has no version %d", vd.name, n)
		}
		if v := vd.manifestVersion(n); v.Stage == StageMaintenance {
			return nil, Version{}, fmt.Errorf("vDisk %s version %d is in maintenance; boot it as %s@maintenance", vd.name, n, vd.name)
		}
		im, err := vd.buildImage(n)
		return im, vd.manifestVersion(n), err
	}
	return nil, Version{}, fmt.Errorf("unknown stage %q: use production, test, maintenance or vN", stage)
}
