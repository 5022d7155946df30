package netboot

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

var (
	personalityKey   = regexp.MustCompile(`^[a-z][a-z0-9_]{0,31}$`)
	personalityValue = regexp.MustCompile(`^[A-Za-z0-9._:@,/+-]{0,128}$`)
)

// maxPersonality bounds what a device's personality adds to the kernel
// command line, which x86 cuts at 2048 bytes with the vDisk's own
// cmdline and deskway's parameters in it too.
const maxPersonality = 1024

// checkPersonality says what is wrong with a personality, if anything:
// its keys and values go on the kernel command line and into a shell's
// file unquoted, so they hold no space, quote or shell character.
func checkPersonality(p map[string]string) error {
	if args := PersonalityArgs(p); len(args) > maxPersonality {
		return fmt.Errorf("the personality takes %d bytes of the kernel command line; at most %d fit beside the vDisk's own", len(args), maxPersonality)
	}
	for _, k := range slices.Sorted(maps.Keys(p)) {
		if !personalityKey.MatchString(k) {
			return fmt.Errorf("personality key %q: use lower-case letters, digits and underscores, at most 32, starting with a letter", k)
		}
		if !personalityValue.MatchString(p[k]) {
			return fmt.Errorf("personality value of %s, %q: use letters, digits and . _ : @ , / + -, at most 128, no spaces or quotes (it goes on the kernel command line)", k, p[k])
		}
	}
	return nil
}

// PersonalityArgs is the personality as kernel parameters, by key, each
// with a space before it.
func PersonalityArgs(p map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(p)) {
		fmt.Fprintf(&b, " deskway.p.%s=%s", k, p[k])
	}
	return b.String()
}
