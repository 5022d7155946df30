package stream

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// bootLog is the durable record of the boots a server has started and
// not yet ended, kept in the store. A boot's write cache lives in RAM and
// unlinked spill files, so a server that dies loses it; with this record
// the restarted server tells a boot it never had (a fresh one: start it)
// from one whose writes it lost (refuse it, so the client's disk fails
// loudly rather than reading back a disk that forgot acknowledged writes).
//
// The file holds JSON lines. A start is synced before the boot serves its
// first request; many boots starting at once share one fsync (group
// commit). An end is not waited for: lost, it only makes a boot that
// ended look lost, which refuses a client that is not coming back.
type bootLog struct {
	path string

	mu   sync.Mutex // guards the fields below
	f    *os.File
	buf  []byte // lines not yet written
	seq  uint64 // lines appended so far
	live map[string]bootRecord
	lost map[string]bootRecord
	size int64 // bytes in the file, for compaction

	syncMu sync.Mutex // one writer and fsync at a time
	synced uint64     // lines durable so far, under syncMu
}

// bootRecord is one line of the log.
type bootRecord struct {
	Op      string    `json:"op"` // start, end, or lost (a start from before a restart)
	Key     string    `json:"key"`
	Version int       `json:"version,omitempty"`
	Time    time.Time `json:"time"` // when the boot started
	// Lost is when a lost boot's cache went: its retention counts from
	// here, not from the start (a boot may have run for weeks).
	Lost time.Time `json:"lost,omitzero"`
	// Why a lost boot's cache is gone, when not because the server
	// stopped: it was discarded after its client did not come back.
	Why string `json:"why,omitempty"`
}

// lostRetention is how long a lost boot is remembered. A client whose
// boot is lost is refused until it boots again with a new boot id;
// after this, a client still retrying the old id would get a fresh disk.
const lostRetention = 7 * 24 * time.Hour

// compactAt is the file size past which the log is rewritten with only
// what it still needs.
const compactAt = 4 << 20

// openBootLog reads the log at path (made if missing). Boots it lists as
// started and not ended were live when the previous process stopped; keep
// says which of those still have their cache (a shared store), and the
// rest are recorded as lost. The file is then rewritten compactly.
func openBootLog(path string, keep func(key string) bool, now time.Time) (*bootLog, error) {
	l := &bootLog{path: path, live: map[string]bootRecord{}, lost: map[string]bootRecord{}}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("stream: boot log: %w", err)
	}
	if err := l.read(); err != nil {
		return nil, err
	}
	for k, r := range l.live {
		if keep != nil && keep(k) {
			continue
		}
		delete(l.live, k)
		r.Op, r.Lost = "lost", now.UTC()
		l.lost[k] = r
	}
	for k, r := range l.lost {
		at := r.Lost
		if at.IsZero() { // written before losses were dated
			at = r.Time
		}
		if now.Sub(at) > lostRetention {
			delete(l.lost, k)
		}
	}
	if err := l.rewrite(); err != nil {
		return nil, err
	}
	return l, nil
}

// read replays the file. A torn last line (the process died writing it)
// is dropped; rewrite then leaves it out of the file.
func (l *bootLog) read() error {
	f, err := os.Open(l.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stream: boot log: %w", err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	for {
		line, err := br.ReadBytes('\n')
		if err == io.EOF {
			return nil // a last line without its newline is torn
		}
		if err != nil {
			return fmt.Errorf("stream: boot log %s: %w", l.path, err)
		}
		var r bootRecord
		if json.Unmarshal(bytes.TrimSpace(line), &r) != nil || r.Key == "" {
			return fmt.Errorf("stream: boot log %s: a line is not a boot record: %.80q", l.path, line)
		}
		switch r.Op {
		case "start":
			l.live[r.Key] = r
			delete(l.lost, r.Key)
		case "end":
			delete(l.live, r.Key)
			delete(l.lost, r.Key)
		case "lost":
			// An expiry follows its boot's start in the file: the boot is
			// lost for the reason it gives, not live.
			delete(l.live, r.Key)
			l.lost[r.Key] = r
		}
	}
}

// rewrite replaces the file with the records still needed, atomically.
// The caller holds syncMu (or is the only user, in open).
func (l *bootLog) rewrite() error {
	var b []byte
	for _, m := range []map[string]bootRecord{l.lost, l.live} {
		for _, r := range m {
			line, _ := json.Marshal(r)
			b = append(append(b, line...), '\n')
		}
	}
	tmp := l.path + ".new"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("stream: boot log: %w", err)
	}
	if _, err := f.Write(b); err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(tmp, l.path)
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("stream: boot log: %w", err)
	}
	if err := syncDir(filepath.Dir(l.path)); err != nil {
		f.Close()
		return err
	}
	if l.f != nil {
		l.f.Close()
	}
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		f.Close()
		return fmt.Errorf("stream: boot log: %w", err)
	}
	l.f, l.size = f, int64(len(b))
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("stream: sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("stream: sync %s: %w", dir, err)
	}
	return nil
}

// lostAt reports whether key names a boot whose cache was lost, with its
// record: when it started, and why its cache is gone.
func (l *bootLog) lostAt(key string) (bootRecord, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.lost[key]
	return r, ok
}

// expire records that a live boot's cache was discarded for why, so that
// a client naming the boot later is refused. It is not waited for: lost,
// the boot is still live in the file, which a restart also takes as lost.
func (l *bootLog) expire(key, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.live[key]
	if !ok {
		return
	}
	delete(l.live, key)
	r.Op, r.Why, r.Lost = "lost", why, time.Now().UTC()
	l.lost[key] = r
	l.appendLocked(r)
}

// start records a new boot and returns once the record is durable.
func (l *bootLog) start(key string, version int) error {
	r := bootRecord{Op: "start", Key: key, Version: version, Time: time.Now().UTC()}
	l.mu.Lock()
	l.live[key] = r
	seq := l.appendLocked(r)
	l.mu.Unlock()
	return l.sync(seq)
}

// end records that a boot ended, without waiting for it to be durable.
func (l *bootLog) end(key string) {
	l.mu.Lock()
	delete(l.live, key)
	delete(l.lost, key)
	l.appendLocked(bootRecord{Op: "end", Key: key, Time: time.Now().UTC()})
	l.mu.Unlock()
}

// forget drops the lost boots whose keys match, durably (a restart must
// not bring them back), and returns their keys.
func (l *bootLog) forget(match func(key string) bool) ([]string, error) {
	l.mu.Lock()
	var keys []string
	var seq uint64
	for k := range l.lost {
		if match(k) {
			delete(l.lost, k)
			keys = append(keys, k)
			seq = l.appendLocked(bootRecord{Op: "end", Key: k, Time: time.Now().UTC()})
		}
	}
	l.mu.Unlock()
	if len(keys) == 0 {
		return nil, nil
	}
	return keys, l.sync(seq)
}

func (l *bootLog) appendLocked(r bootRecord) uint64 {
	line, _ := json.Marshal(r)
	l.buf = append(append(l.buf, line...), '\n')
	l.seq++
	return l.seq
}

// sync makes every line up to seq durable. Whoever holds syncMu writes
// and syncs what all callers appended meanwhile, so a storm of boots
// starting at once costs a few fsyncs, not one each.
func (l *bootLog) sync(seq uint64) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	if l.synced >= seq {
		return nil
	}
	l.mu.Lock()
	buf, upto := l.buf, l.seq
	l.buf = nil
	l.mu.Unlock()
	if _, err := l.f.Write(buf); err != nil {
		return fmt.Errorf("stream: boot log: %w", err)
	}
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("stream: boot log: %w", err)
	}
	l.synced = upto
	l.size += int64(len(buf))
	if l.size > compactAt {
		l.mu.Lock()
		err := l.rewrite()
		l.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// close writes what is pending and closes the file.
func (l *bootLog) close() error {
	l.mu.Lock()
	seq := l.seq
	l.mu.Unlock()
	err := l.sync(seq)
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	if l.f != nil {
		l.f.Close()
		l.f = nil
	}
	return err
}
