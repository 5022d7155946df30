package broker

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
	"github.com/deskway/deskway/internal/broker/brokerclient"
)

// refusal is a request the broker turns down: the HTTP status and the
// message its API answers with.
type refusal struct {
	status int
	msg    string
	// retryAfter, when set, tells the client that trying again later may
	// succeed (the Retry-After header).
	retryAfter time.Duration
}

func refuse(status int, format string, a ...any) *refusal {
	return &refusal{status: status, msg: fmt.Sprintf(format, a...)}
}

// refused answers an HTTP request with rf.
func (s *Server) refused(w http.ResponseWriter, r *http.Request, rf *refusal) {
	if rf.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(rf.retryAfter.Seconds())))
	}
	s.fail(w, r, rf.status, "%s", rf.msg)
}

// Local is this broker's front-end API for a portal in the same process:
// what a front end asks over HTTPS with its token, without the socket,
// the HTTP parsing and the JSON in between, which cost a portal launch
// storm about a tenth of its CPU. The caller is trusted as a front end
// is, so it must be the process's own portal, acting for users it
// authenticated. A refusal is a *brokerclient.StatusError, as a front end
// over HTTPS gets.
type Local struct {
	s       *Server
	retries int
}

// Local returns the in-process front-end API of s. A launch refused with
// a Retry-After (the launch cap reached, every host busy with logons) is
// tried again up to retries times, as brokerclient.Client.Launch does.
func (s *Server) Local(retries int) *Local { return &Local{s: s, retries: retries} }

// RemoteAddr is what the broker's logs give as the address of an
// in-process front end's requests.
const RemoteAddr = "in-process"

// Launch starts or reconnects a session for the user req names.
func (l *Local) Launch(ctx context.Context, req brokerapi.LaunchRequest) (*brokerapi.LaunchResponse, error) {
	resp, _, err := brokerclient.RetryLaunch(ctx, l.retries, func(ctx context.Context) (*brokerapi.LaunchResponse, error) {
		resp, rf := l.s.launchFor(ctx, l.s.now(), caller{frontend: true}, req)
		if rf != nil {
			return nil, l.s.localRefusal(ctx, "launch", rf)
		}
		return resp, nil
	})
	return resp, err
}

// Desktops lists the delivery groups the user req names may launch.
func (l *Local) Desktops(ctx context.Context, req brokerapi.DesktopsRequest) ([]brokerapi.Desktop, error) {
	who, rf := l.s.onBehalf(caller{frontend: true}, req.User, req.Groups)
	if rf == nil {
		var ds []brokerapi.Desktop
		if ds, rf = l.s.desktopsOf(ctx, who); rf == nil {
			return ds, nil
		}
	}
	return nil, l.s.localRefusal(ctx, "desktops", rf)
}

// Logoff queues the logoff of the live session id of the user req names.
func (l *Local) Logoff(ctx context.Context, id string, req brokerapi.DesktopsRequest) (*brokerapi.CommandStatus, error) {
	who, rf := l.s.onBehalf(caller{frontend: true}, req.User, req.Groups)
	if rf == nil {
		var st brokerapi.CommandStatus
		if st, rf = l.s.logoffOwn(ctx, who, id); rf == nil {
			return &st, nil
		}
	}
	return nil, l.s.localRefusal(ctx, "logoff", rf)
}

// localRefusal logs rf as the HTTP API logs its refusals and returns it
// as a front end over HTTPS would read it.
func (s *Server) localRefusal(ctx context.Context, call string, rf *refusal) error {
	s.log.Log(ctx, refusalLevel(rf.status), "request refused", "call", call, "status", rf.status, "remote", RemoteAddr, "error", rf.msg)
	return &brokerclient.StatusError{Status: rf.status, Message: rf.msg, RetryAfter: rf.retryAfter}
}
