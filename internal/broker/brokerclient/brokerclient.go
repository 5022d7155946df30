// Package brokerclient calls the broker's API: launches (retrying when the
// broker says to with 503 and Retry-After, as a store front does), and the
// agent's register, heartbeat and events.
package brokerclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/deskway/deskway/internal/broker/brokerapi"
)

// Client talks to one broker.
type Client struct {
	// Base is the broker's URL, https://host:port.
	Base string
	HTTP *http.Client
	// MaxRetries bounds retries of a launch the broker asked to retry.
	MaxRetries int
}

// StatusError is a non-2xx answer.
type StatusError struct {
	Status     int
	Message    string
	RetryAfter time.Duration
}

// Error gives the HTTP status and the broker's own message.
func (e *StatusError) Error() string {
	return fmt.Sprintf("broker: %d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
}

// Credentials authenticate a request.
type Credentials func(*http.Request)

// Basic authenticates as a user.
func Basic(user, password string) Credentials {
	return func(r *http.Request) { r.SetBasicAuth(user, password) }
}

// Bearer authenticates with a token (front end, join token, agent credential).
func Bearer(token string) Credentials {
	return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token) }
}

func (c *Client) do(ctx context.Context, path string, cred Credentials, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(c.Base, "/")+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if cred != nil {
		cred(req)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("broker: read answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		se := &StatusError{Status: resp.StatusCode}
		var e brokerapi.Error
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			se.Message = e.Error
		} else {
			se.Message = strings.TrimSpace(string(b))
		}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
			se.RetryAfter = time.Duration(s) * time.Second
		}
		return se
	}
	if out == nil || len(b) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("broker: answer is not the expected JSON: %w", err)
	}
	return nil
}

// Launch asks for a desktop. When the broker answers 503 with Retry-After
// (its launch cap is reached, or every host is busy with logons) it waits
// that long, give or take half, and tries again, up to MaxRetries times.
func (c *Client) Launch(ctx context.Context, cred Credentials, req brokerapi.LaunchRequest) (*brokerapi.LaunchResponse, int, error) {
	return RetryLaunch(ctx, c.MaxRetries, func(ctx context.Context) (*brokerapi.LaunchResponse, error) {
		var out brokerapi.LaunchResponse
		if err := c.do(ctx, "/api/v1/launch", cred, req, &out); err != nil {
			return nil, err
		}
		return &out, nil
	})
}

// RetryLaunch runs launch until it succeeds or fails otherwise than with
// a 503 StatusError carrying a RetryAfter, waiting that long, give or take
// half, between tries, and trying at most retries times more. It returns
// the tries made after the first.
func RetryLaunch(ctx context.Context, retries int, launch func(context.Context) (*brokerapi.LaunchResponse, error)) (*brokerapi.LaunchResponse, int, error) {
	for try := 0; ; try++ {
		out, err := launch(ctx)
		se, ok := err.(*StatusError)
		if !ok || se.Status != http.StatusServiceUnavailable || se.RetryAfter == 0 || try >= retries {
			return out, try, err
		}
		wait := time.Duration(float64(se.RetryAfter) * (0.5 + rand.Float64()))
		select {
		case <-ctx.Done():
			return nil, try, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// Desktops lists the delivery groups a user may launch, with their
// sessions.
func (c *Client) Desktops(ctx context.Context, cred Credentials, req brokerapi.DesktopsRequest) ([]brokerapi.Desktop, error) {
	var out []brokerapi.Desktop
	if err := c.do(ctx, "/api/v1/desktops", cred, req, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// SessionEnd asks how the user's own session id ended, counting the
// logoff and disconnect commands since since (req names the user when
// cred is a front end's).
func (c *Client) SessionEnd(ctx context.Context, cred Credentials, id string, since time.Time, req brokerapi.DesktopsRequest) (*brokerapi.SessionEnd, error) {
	var out brokerapi.SessionEnd
	path := "/api/v1/sessions/" + url.PathEscape(id) + "/end?since=" + strconv.FormatInt(since.UnixMilli(), 10)
	if err := c.do(ctx, path, cred, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Logoff asks for the user's own session id to be logged off (req names
// the user when cred is a front end's).
func (c *Client) Logoff(ctx context.Context, cred Credentials, id string, req brokerapi.DesktopsRequest) (*brokerapi.CommandStatus, error) {
	var out brokerapi.CommandStatus
	if err := c.do(ctx, "/api/v1/sessions/"+url.PathEscape(id)+"/logoff", cred, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Register joins a host to the delivery group of joinToken.
func (c *Client) Register(ctx context.Context, joinToken string, req brokerapi.RegisterRequest) (*brokerapi.RegisterResponse, error) {
	var out brokerapi.RegisterResponse
	if err := c.do(ctx, "/api/v1/agent/register", Bearer(joinToken), req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Heartbeat reports a host's load, health and sessions.
// The answer holds the session control commands waiting for the host.
func (c *Client) Heartbeat(ctx context.Context, credential string, hb brokerapi.Heartbeat) ([]brokerapi.Command, error) {
	var res brokerapi.HeartbeatResponse
	err := c.do(ctx, "/api/v1/agent/heartbeat", Bearer(credential), hb, &res)
	return res.Commands, err
}

// CommandResult answers a command the broker handed this host.
func (c *Client) CommandResult(ctx context.Context, credential, id string, res brokerapi.CommandResult) error {
	return c.do(ctx, "/api/v1/agent/commands/"+url.PathEscape(id), Bearer(credential), res, nil)
}

// Events reports session changes.
func (c *Client) Events(ctx context.Context, credential string, ev brokerapi.Events) error {
	return c.do(ctx, "/api/v1/agent/events", Bearer(credential), ev, nil)
}

// PeerSessions asks a broker sharing this one's database which live
// sessions or pending placements of req.User its local host cache holds;
// token is a peer token (auth.Tokens.MintPeer) naming that user.
func (c *Client) PeerSessions(ctx context.Context, token string, req brokerapi.PeerQuery) (*brokerapi.PeerSessions, error) {
	var out brokerapi.PeerSessions
	if err := c.do(ctx, "/api/v1/peer/sessions", Bearer(token), req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// FrontEnd is a portal's view of a broker over HTTPS: a user's calls,
// made on their behalf with a front-end token.
type FrontEnd struct {
	Client *Client
	Token  string
}

// Launch starts or reconnects a session for the user req names,
// retrying as Client.Launch does.
func (f FrontEnd) Launch(ctx context.Context, req brokerapi.LaunchRequest) (*brokerapi.LaunchResponse, error) {
	res, _, err := f.Client.Launch(ctx, Bearer(f.Token), req)
	return res, err
}

// Desktops lists the delivery groups the user req names may launch.
func (f FrontEnd) Desktops(ctx context.Context, req brokerapi.DesktopsRequest) ([]brokerapi.Desktop, error) {
	return f.Client.Desktops(ctx, Bearer(f.Token), req)
}

// SessionEnd asks how the user's own session id ended, counting the
// commands since since.
func (f FrontEnd) SessionEnd(ctx context.Context, id string, since time.Time, req brokerapi.DesktopsRequest) (*brokerapi.SessionEnd, error) {
	return f.Client.SessionEnd(ctx, Bearer(f.Token), id, since, req)
}

// Logoff asks for the user's own session id to be logged off.
func (f FrontEnd) Logoff(ctx context.Context, id string, req brokerapi.DesktopsRequest) (*brokerapi.CommandStatus, error) {
	return f.Client.Logoff(ctx, Bearer(f.Token), id, req)
}
