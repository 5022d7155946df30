package web

import (
	"errors"
	"net/http"
)

// consoleConfirm is the question a console action asks before it acts.
type consoleConfirm struct {
	Question, Detail, Button string
	// Action is the form's own path, posted again with confirmed=yes
	// and the fields in Keep; Back is where Cancel goes.
	Action, Back string
	Keep         map[string]string
}

// sessionConfirm is the question before a session's logoff or
// disconnect; a message needs none. The user and host come from the
// row's form, for the question's words only: the action names the
// session by its id.
func sessionConfirm(kind string) func(*http.Request) consoleConfirm {
	if kind != "logoff" && kind != "disconnect" {
		return nil
	}
	return func(r *http.Request) consoleConfirm {
		who, host := r.PostFormValue("user"), r.PostFormValue("host")
		if who == "" {
			who = "this user"
		}
		if host == "" {
			host = "its host"
		}
		if kind == "logoff" {
			return consoleConfirm{Question: "Log " + who + " off " + host + "?", Button: "Log off",
				Detail: "The session's programs are closed; work not saved in them is lost."}
		}
		return consoleConfirm{Question: "Disconnect " + who + " from " + host + "?", Button: "Disconnect",
			Detail: "The session keeps running on the host; " + who + " can reconnect to it."}
	}
}

// apiWords is what a console page says of a failed admin API call: the
// API's own refusal, which is written for administrators, or, when the
// API did not answer, a sentence, with the reason in the portal's log.
func (s *Server) apiWords(err error) string {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.msg
	}
	s.d.Logger.Warn("the console's admin API call failed", "error", err)
	return "the admin API does not answer right now; the portal's log has the reason."
}
