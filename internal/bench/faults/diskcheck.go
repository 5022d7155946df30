package faults

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	_ "modernc.org/sqlite" // the broker's database, read after the run
)

// diskAdmin drains (or undrains) host through the admin API and returns
// the status and message answered.
func diskAdmin(ctx context.Context, hc *http.Client, admin, host string, drain bool) (int, string) {
	path, body := "/undrain", ""
	if drain {
		path, body = "/drain", `{"drain":true}`
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, admin+"/api/v1/broker/hosts/"+host+path, strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+diskAdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// brokerDB is what the broker's database held after the run.
type brokerDB struct {
	integrity string
	// missing are launches answered as placed that have no session row,
	// or one on another host.
	missing []string
	// orphans are session rows whose host row is gone.
	orphans int
	// audited counts the audit entries of drains done, by action, and
	// of those refused ("refused").
	audited map[string]int
}

// checkBrokerDB opens the database the stopped broker left and checks
// it against what the clients were told.
func checkBrokerDB(path string, ld *diskLoad) (brokerDB, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		return brokerDB{}, fmt.Errorf("disk scenario: open the broker's database: %w", err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := brokerDB{audited: map[string]int{}}
	if err := db.QueryRowContext(ctx, `PRAGMA integrity_check`).Scan(&out.integrity); err != nil {
		return out, fmt.Errorf("disk scenario: integrity check: %w", err)
	}
	hostOf := map[string]string{}
	rows, err := db.QueryContext(ctx, `SELECT id, host_name FROM sessions`)
	if err != nil {
		return out, fmt.Errorf("disk scenario: sessions: %w", err)
	}
	for rows.Next() {
		var id, host string
		if err := rows.Scan(&id, &host); err != nil {
			rows.Close()
			return out, fmt.Errorf("disk scenario: sessions: %w", err)
		}
		hostOf[id] = host
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return out, fmt.Errorf("disk scenario: sessions: %w", err)
	}
	for user, l := range ld.launched {
		if hostOf[l.SessionID] != l.Host {
			out.missing = append(out.missing, fmt.Sprintf("%s (session %s on %s)", user, l.SessionID, l.Host))
		}
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sessions WHERE host_name NOT IN (SELECT name FROM hosts)`).Scan(&out.orphans); err != nil {
		return out, fmt.Errorf("disk scenario: orphan sessions: %w", err)
	}
	arows, err := db.QueryContext(ctx, `SELECT action, status, count(*) FROM audit WHERE action LIKE 'POST /api/v1/broker/hosts/%' GROUP BY action, status`)
	if err != nil {
		return out, fmt.Errorf("disk scenario: audit: %w", err)
	}
	defer arows.Close()
	for arows.Next() {
		var action string
		var status, n int
		if err := arows.Scan(&action, &status, &n); err != nil {
			return out, fmt.Errorf("disk scenario: audit: %w", err)
		}
		switch status {
		case 200:
			out.audited[action[strings.LastIndex(action, "/")+1:]] += n
		case 503:
			out.audited["refused"] += n
		}
	}
	return out, arows.Err()
}

// diskOutcomes counts what the clients, the administrators and the
// database saw into the broker's and the audit trail's outcomes.
func diskOutcomes(ld *diskLoad, db brokerDB, blog string, hosts, workers int, fillAt, back time.Time) []Outcome {
	// The broker's log must name the place that is full and why.
	named := strings.Contains(blog, "no space left") && strings.Contains(blog, "state directory")
	recoverS := -1.0
	if !ld.firstOKAfter.IsZero() {
		recoverS = seconds(ld.firstOKAfter.Sub(back))
	}
	lost := len(db.missing)
	launch := Outcome{Scenario: "disk", Case: "the broker's state directory (SQLite database, host cache copy and journal) fills during a launch storm, then space returns",
		Load: fmt.Sprintf("%d clients launching new users in a loop through the broker's HTTP API onto %d hosts", workers, hosts), Users: workers,
		Affected: min(workers, ld.refusedDuring), RecoverS: recoverS,
		Metrics: map[string]float64{
			"launches_ok": float64(len(ld.launched)), "launches_refused": float64(ld.refused), "launches_refused_during": float64(ld.refusedDuring),
			"launches_lost": float64(lost), "sessions_without_host": float64(db.orphans), "refusals_with_internal_errors": float64(len(ld.badRefusals)),
			"other_errors": float64(len(ld.otherErrs)), "fault_s": seconds(back.Sub(fillAt)),
		},
	}
	if db.integrity != "ok" {
		launch.Metrics["corrupt_database"] = 1
	}
	launch.Held = lost == 0 && db.orphans == 0 && db.integrity == "ok" && len(ld.badRefusals) == 0 && len(ld.otherErrs) == 0 &&
		ld.refusedDuring > 0 && named && recoverS >= 0 && recoverS < 5
	launch.Notes = fmt.Sprintf("%d launches placed and all %d in the database; %d refused while the disk was full (%d of all refusals showed an internal error); database integrity %q; log names the full state directory: %v; launches placed again %.2f s after space returned, without a restart",
		len(ld.launched), len(ld.launched)-lost, ld.refusedDuring, len(ld.badRefusals), db.integrity, named, recoverS)
	if len(ld.badRefusals) > 0 {
		launch.Notes += "; first refusal showing an internal error: " + ld.badRefusals[0] + "; last: " + ld.badRefusals[len(ld.badRefusals)-1]
	}
	if len(ld.otherErrs) > 0 {
		launch.Notes += "; first other error: " + ld.otherErrs[0]
	}
	if lost > 0 {
		launch.Notes += "; first launch missing from the database: " + db.missing[0]
	}

	adminRecover := -1.0
	if !ld.firstAdminOK.IsZero() {
		adminRecover = seconds(ld.firstAdminOK.Sub(back))
	}
	// Refused actions are in the trail too: their entries, which could
	// not be written while the disk was full, waited and were written
	// once there was room.
	unaudited := max(0, ld.adminRefuse-db.audited["refused"])
	for action, n := range ld.drains {
		unaudited += max(0, n-db.audited[action])
	}
	audit := Outcome{Scenario: "disk", Case: "the audit trail's disk (the broker's database) fills while administrators drain and undrain a host",
		Load: "an administrator draining and undraining a host every 100 ms through the admin API, beside the launch storm", Users: 1,
		RecoverS: adminRecover,
		Metrics: map[string]float64{
			"admin_actions_ok": float64(ld.drains["drain"] + ld.drains["undrain"]), "admin_actions_refused": float64(ld.adminRefuse),
			"admin_actions_unaudited": float64(unaudited),
		},
	}
	if ld.adminRefuse > 0 {
		audit.Affected = 1
	}
	audit.Held = unaudited == 0 && adminRecover >= 0 && adminRecover < 5
	audit.Notes = fmt.Sprintf("%d admin actions done and %d refused while the disk was full, every one of them in the audit trail but %d; actions done again %.2f s after space returned",
		ld.drains["drain"]+ld.drains["undrain"], ld.adminRefuse, unaudited, adminRecover)
	return []Outcome{launch, audit}
}
