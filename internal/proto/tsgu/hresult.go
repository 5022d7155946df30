package tsgu

import "fmt"

// HRESULT is a status code in a response or close packet. FreeRDP treats any
// code without the high bit as success, so every refusal this project sends
// is one of the 0x8007xxxx forms below.
type HRESULT uint32

// Status codes (MS-TSGU 2.2.6). The E_PROXY_* codes the spec lists without
// the high bit are given here in their HRESULT_FROM_WIN32 form.
const (
	SOK                                 HRESULT = 0x00000000
	EProxyInternalError                 HRESULT = 0x800759D8
	EProxyRAPAccessDenied               HRESULT = 0x800759DA
	EProxyNAPAccessDenied               HRESULT = 0x800759DB
	EProxyTSConnectFailed               HRESULT = 0x800759DD
	EProxyAlreadyDisconnected           HRESULT = 0x800759DF
	EProxyMaxConnectionsReached         HRESULT = 0x800759E6
	EProxyNotSupported                  HRESULT = 0x800759E8
	EProxyCapabilityMismatch            HRESULT = 0x800759E9
	EProxyQuarantineAccessDenied        HRESULT = 0x800759ED
	EProxyNoCertAvailable               HRESULT = 0x800759EE
	EProxySessionTimeout                HRESULT = 0x800759F6
	EProxyCookieBadPacket               HRESULT = 0x800759F7
	EProxyCookieAuthenticationDenied    HRESULT = 0x800759F8
	EProxyUnsupportedAuthenticationMeth HRESULT = 0x800759F9
	EProxyConnectionAborted             HRESULT = 0x800704D4
	EAccessDenied                       HRESULT = 0x80070005
	EBadArguments                       HRESULT = 0x800700A0
	EOperationAborted                   HRESULT = 0x800703E3
	EGracefulDisconnect                 HRESULT = 0x800704CA
)

var hresultNames = map[HRESULT]string{
	SOK:                                 "S_OK",
	EProxyInternalError:                 "E_PROXY_INTERNALERROR",
	EProxyRAPAccessDenied:               "E_PROXY_RAP_ACCESSDENIED",
	EProxyNAPAccessDenied:               "E_PROXY_NAP_ACCESSDENIED",
	EProxyTSConnectFailed:               "E_PROXY_TS_CONNECTFAILED",
	EProxyAlreadyDisconnected:           "E_PROXY_ALREADYDISCONNECTED",
	EProxyMaxConnectionsReached:         "E_PROXY_MAXCONNECTIONSREACHED",
	EProxyNotSupported:                  "E_PROXY_NOTSUPPORTED",
	EProxyCapabilityMismatch:            "E_PROXY_CAPABILITYMISMATCH",
	EProxyQuarantineAccessDenied:        "E_PROXY_QUARANTINE_ACCESSDENIED",
	EProxyNoCertAvailable:               "E_PROXY_NOCERTAVAILABLE",
	EProxySessionTimeout:                "E_PROXY_SESSIONTIMEOUT",
	EProxyCookieBadPacket:               "E_PROXY_COOKIE_BADPACKET",
	EProxyCookieAuthenticationDenied:    "E_PROXY_COOKIE_AUTHENTICATION_ACCESS_DENIED",
	EProxyUnsupportedAuthenticationMeth: "E_PROXY_UNSUPPORTED_AUTHENTICATION_METHOD",
	EProxyConnectionAborted:             "E_PROXY_CONNECTIONABORTED",
	EAccessDenied:                       "E_ACCESSDENIED",
	EBadArguments:                       "ERROR_BAD_ARGUMENTS",
	EOperationAborted:                   "ERROR_OPERATION_ABORTED",
	EGracefulDisconnect:                 "ERROR_GRACEFUL_DISCONNECT",
}

// Failed reports whether h is an error by HRESULT rules (high bit set).
func (h HRESULT) Failed() bool { return h&0x80000000 != 0 }

// String returns the spec's name, or the hex value for codes it does not name.
func (h HRESULT) String() string {
	if n, ok := hresultNames[h]; ok {
		return n
	}
	return fmt.Sprintf("HRESULT(0x%08X)", uint32(h))
}
