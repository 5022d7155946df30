package stream

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// AssignedFunc names the devices assigned to vdisk at any of stages
// (production, test, maintenance), each as "NAME (STAGE)": the network
// boot services' records, which the stream server does not keep.
type AssignedFunc func(vdisk string, stages []string) []string

// SetAssigned lets the version operations name the devices a version is
// assigned to. Call it before Serve.
func (s *Server) SetAssigned(f AssignedFunc) { s.assigned = f }

// runningOnLocked names the clients whose live boots on this server run
// version n of vd, by name. Callers hold s.mu.
func (s *Server) runningOnLocked(vd *vdisk, n int) []string {
	var out []string
	for _, b := range s.boots {
		if b.vd == vd && !b.ended && b.img.version == n && !slices.Contains(out, b.client) {
			out = append(out, b.client)
		}
	}
	slices.Sort(out)
	return out
}

// stagesOf lists the stages whose clients boot version n now. Callers
// hold vd.mu with the manifest loaded.
func (vd *vdisk) stagesOf(n int) []string {
	var out []string
	for _, st := range []string{StageProduction, StageTest} {
		if vd.newest(st) == n {
			out = append(out, st)
		}
	}
	if v, ok := vd.find(n); ok && v.Stage == StageMaintenance {
		out = append(out, StageMaintenance)
	}
	return out
}

// demote moves version n one stage back: production to test (production
// clients then boot the newest production version before it), test to
// maintenance (it can be changed again). Boots keep the version they
// started on.
func (s *Server) demote(vd *vdisk, n int) (Version, error) {
	// s.mu before vd.mu, as attach takes them: no boot starts on the
	// version between the look at the live boots and the change.
	s.mu.Lock()
	defer s.mu.Unlock()
	vd.mu.Lock()
	defer vd.mu.Unlock()
	if err := vd.loadVersions(); err != nil {
		return Version{}, err
	}
	i := slices.IndexFunc(vd.manifest.Versions, func(v Version) bool { return v.Version == n })
	if i < 0 {
		if n == 0 {
			return Version{}, fmt.Errorf("%w: version 0 is the base image (stream.vdisks[].base), always in production; demote the versions above it instead", errVersion)
		}
		return Version{}, fmt.Errorf("%w: vDisk %s has no version %d", errVersion, vd.name, n)
	}
	v := vd.manifest.Versions[i]
	switch v.Stage {
	case StageProduction:
		others := slices.ContainsFunc(vd.manifest.Versions, func(o Version) bool { return o.Version != n && o.Stage == StageProduction })
		if !others {
			return Version{}, fmt.Errorf("%w: version %d is the only production version of %s: demoting it would send production devices back to the base image. Promote the version they should boot to production first (deskway vdisk version promote %s N), then demote %d",
				errVersion, n, vd.name, vd.name, n)
		}
		vd.manifest.Versions[i].Stage = StageTest
	case StageTest:
		for _, o := range vd.manifest.Versions {
			if o.Stage == StageMaintenance {
				return Version{}, fmt.Errorf("%w: version %d is already in maintenance (one at a time); promote or delete it first", errVersion, o.Version)
			}
			if o.Version > n {
				return Version{}, fmt.Errorf("%w: version %d is not the newest (version %d came after it and may be built on it), so it cannot be changed again; make a new version instead", errVersion, n, o.Version)
			}
		}
		if who := s.runningOnLocked(vd, n); len(who) > 0 {
			return Version{}, fmt.Errorf("%w: %s %s running version %d; it can go back to maintenance once %s shut down or booted another version", errVersion, plural(who, "device", "devices"), isAre(who), n, theyHave(who))
		}
		vd.manifest.Versions[i].Stage = StageMaintenance
		delete(vd.built, n) // a maintenance version changes
	default:
		return Version{}, fmt.Errorf("%w: version %d is in maintenance, the first stage; delete it to drop its changes", errVersion, n)
	}
	out := vd.manifest.Versions[i]
	return out, vd.saveManifest()
}

// deleteVersion removes version n and its files, when no device boots
// it, none is assigned to it and no other version is built on it.
func (s *Server) deleteVersion(vd *vdisk, n int) error {
	// s.mu before vd.mu, as attach takes them: no boot starts on the
	// version between the look at the live boots and the change.
	s.mu.Lock()
	defer s.mu.Unlock()
	vd.mu.Lock()
	defer vd.mu.Unlock()
	if err := vd.loadVersions(); err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%w: version 0 is the base image (stream.vdisks[].base); it is not deleted through the API", errVersion)
	}
	i := slices.IndexFunc(vd.manifest.Versions, func(v Version) bool { return v.Version == n })
	if i < 0 {
		return fmt.Errorf("%w: vDisk %s has no version %d", errVersion, vd.name, n)
	}
	v := vd.manifest.Versions[i]
	var assigned []string
	if stages := vd.stagesOf(n); len(stages) > 0 && s.assigned != nil {
		assigned = s.assigned(vd.name, stages)
	}
	if slices.Contains(vd.stagesOf(n), StageProduction) {
		msg := fmt.Sprintf("version %d is what production clients of %s boot", n, vd.name)
		if len(assigned) > 0 {
			msg += " (" + plural(assigned, "device", "devices") + ")"
		}
		return fmt.Errorf("%w: %s: demote it first, once the version they should boot is in production", errVersion, msg)
	}
	if len(assigned) > 0 {
		return fmt.Errorf("%w: %s %s assigned to vDisk %s at the stage that boots version %d: assign them another vDisk or stage first (deskway device assign), or promote another version past it",
			errVersion, plural(assigned, "device", "devices"), isAre(assigned), vd.name, n)
	}
	if who := s.runningOnLocked(vd, n); len(who) > 0 {
		return fmt.Errorf("%w: %s %s running version %d of %s; it can be deleted once %s shut down or booted another version",
			errVersion, plural(who, "device", "devices"), isAre(who), n, vd.name, theyHave(who))
	}
	for _, o := range vd.manifest.Versions {
		if o.Parent == n && o.MergedBase == "" && o.Version != n {
			return fmt.Errorf("%w: version %d is built on version %d: delete version %d first, or merge", errVersion, o.Version, n, o.Version)
		}
	}
	dir := vd.deltaDir(n)
	if v.Stage == StageMaintenance {
		lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return err
		}
		defer lock.Close()
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			return fmt.Errorf("%w: version %d is open for maintenance by a client; disconnect it first", errVersion, n)
		}
	}
	vd.manifest.Versions = slices.Delete(slices.Clone(vd.manifest.Versions), i, i+1)
	delete(vd.built, n)
	if err := vd.saveManifest(); err != nil {
		return err
	}
	// The manifest no longer names them: a failure here leaves files, not
	// a broken chain.
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("version %d deleted, but its delta stays: %w", n, err)
	}
	if v.MergedBase != "" {
		if err := os.Remove(v.MergedBase); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("version %d deleted, but its image stays: %w", n, err)
		}
	}
	return nil
}

// plural is "device pc1" or "devices pc1, pc2".
func plural(names []string, one, many string) string {
	if len(names) == 1 {
		return one + " " + names[0]
	}
	return many + " " + strings.Join(names, ", ")
}

func theyHave(names []string) string {
	if len(names) == 1 {
		return "it has"
	}
	return "they have"
}

func isAre(names []string) string {
	if len(names) == 1 {
		return "is"
	}
	return "are"
}
