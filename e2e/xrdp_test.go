package e2e

import (
	"testing"

	"github.com/deskway/deskway/internal/testkit"
)

// xrdpCase is one case of TestXRDP or TestXRDPBeside: what was a test of
// its own, with its own rig, checks and deadlines, run on the xrdp setup
// it is given.
type xrdpCase struct {
	name string
	run  func(*testing.T, testkit.XRDPSetup)
}

// TestXRDP and TestXRDPBeside run the cases that start xrdp, each on an
// xrdp setup of its own (testkit.XRDPSetup: sesman's port, the X
// displays, the test account, the lock), so the two run at the same time
// while each runs its cases one after another: a case's xrdp-sesman
// takes its setup's port, and as parallel tests of their own, one
// waiting for the lock held a -parallel slot and did nothing. A case
// mostly waits (a seventh to a quarter of its wall time on CPU), so two
// at once nearly halve the time. As the run's longest tests they take
// no work slot (see parallel): they start as the serial tests end and
// run beside the tests sharing the work slots. TestXRDP runs on the machine's own
// configuration (port 3350, /etc/xrdp), and so has the benches, which
// start xrdp from it; the cases are split between the two by their
// measured times. Run one case with -run 'TestXRDP/BrowserDesktop$',
// which matches both tests' names and so finds the case in either.
func TestXRDP(t *testing.T) {
	t.Parallel()
	runXRDPCases(t, testkit.MachineXRDP(), []xrdpCase{
		{"BrokerLaunchThroughGatewayToXRDP", testBrokerLaunchThroughGatewayToXRDP},
		{"RDPServiceDownTurnsHostUnhealthy", testRDPServiceDownTurnsHostUnhealthy},
		{"SessionControlOnXRDP", testSessionControlOnXRDP},
		{"PortalSignInLaunchAndConnect", testPortalSignInLaunchAndConnect},
		{"BrowserDesktop", testBrowserDesktop},
		{"BrowserRefusalsShown", testBrowserRefusalsShown},
		{"BrowserLogonForm", testBrowserLogonForm},
		{"BrowserDesktopOnPhone", testBrowserDesktopOnPhone},
		{"BrowserBenchSmoke", testBrowserBenchSmoke},
		{"TTFFBenchSmoke", testTTFFBenchSmoke},
	})
}

// TestXRDPBeside is the other half of TestXRDP's cases, on a second
// setup (testkit.SecondXRDP) beside it.
func TestXRDPBeside(t *testing.T) {
	t.Parallel()
	runXRDPCases(t, testkit.SecondXRDP(), []xrdpCase{
		{"XFreeRDPThroughGateway", testXFreeRDPThroughGateway},
		{"GatewayFarmBehindHAProxy", testGatewayFarmBehindHAProxy},
		{"PortalFindAndRecentFirst", testPortalFindAndRecentFirst},
		{"ConsoleInBrowser", testConsoleInBrowser},
		{"BrowserEndsInWords", testBrowserEndsInWords},
		{"BrowserWrongPassword", testBrowserWrongPassword},
		{"BrowserKeyboardLayouts", testBrowserKeyboardLayouts},
		{"XfreerdpKeyboardLayout", testXfreerdpKeyboardLayout},
		{"BrowserDesktopClipboardResizeKeys", testBrowserDesktopClipboardResizeKeys},
		{"BrowserClipboardOfferAtConnect", testBrowserClipboardOfferAtConnect},
	})
}

// runXRDPCases runs cases one after another on setup.
func runXRDPCases(t *testing.T, setup testkit.XRDPSetup, cases []xrdpCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, setup) })
	}
}
