package e2e

import "testing"

// TestXRDP runs, one after another, every case that starts xrdp: each
// case's own xrdp-sesman listens on the machine's port 3350, so one runs
// at a time (testkit.LockSesman); as parallel tests of their own, one
// waiting for the lock held a slot and did nothing. As one parallel test
// it is the run's longest, so it takes no work slot (see parallel): it
// starts as the serial tests end and runs beside the tests sharing the
// -parallel work slots. Each case is what was a test of its own, with
// its own rig, checks and deadlines; run one with
// -run 'TestXRDP/BrowserDesktop$'.
func TestXRDP(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"XFreeRDPThroughGateway", testXFreeRDPThroughGateway},
		{"BrokerLaunchThroughGatewayToXRDP", testBrokerLaunchThroughGatewayToXRDP},
		{"RDPServiceDownTurnsHostUnhealthy", testRDPServiceDownTurnsHostUnhealthy},
		{"SessionControlOnXRDP", testSessionControlOnXRDP},
		{"GatewayFarmBehindHAProxy", testGatewayFarmBehindHAProxy},
		{"PortalSignInLaunchAndConnect", testPortalSignInLaunchAndConnect},
		{"PortalFindAndRecentFirst", testPortalFindAndRecentFirst},
		{"ConsoleInBrowser", testConsoleInBrowser},
		{"BrowserDesktop", testBrowserDesktop},
		{"BrowserRefusalsShown", testBrowserRefusalsShown},
		{"BrowserEndsInWords", testBrowserEndsInWords},
		{"BrowserWrongPassword", testBrowserWrongPassword},
		{"BrowserLogonForm", testBrowserLogonForm},
		{"BrowserKeyboardLayouts", testBrowserKeyboardLayouts},
		{"XfreerdpKeyboardLayout", testXfreerdpKeyboardLayout},
		{"BrowserDesktopOnPhone", testBrowserDesktopOnPhone},
		{"BrowserDesktopClipboardResizeKeys", testBrowserDesktopClipboardResizeKeys},
		{"BrowserClipboardOfferAtConnect", testBrowserClipboardOfferAtConnect},
		{"BrowserBenchSmoke", testBrowserBenchSmoke},
		{"TTFFBenchSmoke", testTTFFBenchSmoke},
	} {
		t.Run(c.name, c.run)
	}
}
